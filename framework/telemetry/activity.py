"""What a rank does while its loop shows no progress, for the stall watchdog (framework/telemetry/stall.py): whether
it computes (a slow step) or waits (a stall), and how fast its batches go.

Computing, over the last window: a thread of the rank's process other than the sampling one (the watchdog's) was
runnable (state R in /proc/self/task/<tid>/stat: on a loaded machine a busy thread waits for a core in that state)
at most samples, or those threads used at least CPU_BUSY of a core between them, or on a GPU the rank's default
stream had work in flight (torch.cuda.Stream.query) at most samples. The whole process, not the loop's thread alone:
torch's intra-op threads do a CPU forward's work, and on a machine with more threads than cores the loop's thread
sleeps at their barrier while they wait for a core (a LeNet loop under a load of 12 on 2 cores showed its loop thread
asleep at 3 of 3 samples, with no CPU, for 0.4 s). Waiting: none of these (threads blocked on a lock, a queue, a
socket or a stuck file system sleep: state S or D, no CPU), or the loop's thread sat inside a torch.distributed (or
Horovod) call at every sample of the window: there a CUDA sync may spin the CPU and an NCCL kernel stays in flight,
and neither is work.

What this cannot tell apart (docs/telemetry.md): on a GPU, an NCCL collective that did not block the thread (DDP's
gradient all-reduce inside backward, FSDP's all-gathers) and waits for a peer is a kernel in flight like any other;
a rank that computes forever (an endless loop), or whose loop is stuck while another of its threads computes, is
never called stalled."""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from framework.common.errors import first_line
from framework.data.batches import batch_size

CPU_BUSY = 0.10  # of one core over the window: threads blocked in a wait use none
IN_FLIGHT, IDLE = "a kernel in flight", "idle"
BATCH_PHASES = ("compute", "evaluate")  # the heartbeat's phases that carry the batch being computed
_COLLECTIVE_FILES = (os.path.join("torch", "distributed", "distributed_c10d.py"),
                     os.path.join("horovod", "torch", "mpi_ops.py"))
_TORCH = os.path.dirname(torch.__file__) + os.sep


@dataclass(frozen=True, kw_only=True)
class Sample:
    wall: float  # time.monotonic()
    cpu: float  # CPU seconds so far of the process's threads but the sampling one
    full: bool = False  # whether the rest was looked at
    running: bool | None = None  # a thread but the sampling one runnable (on a core or waiting for one); None: no /proc
    where: str | None = None  # the innermost forward outside torch: "BusyNet.forward (busy.py:21)"
    collective: str | None = None  # the torch.distributed call the thread is in ("barrier")
    gpu: str | None = None  # IN_FLIGHT, IDLE, "no answer: ...", or None (not a GPU rank)
    process: bool = True  # whose CPU and states: the process's threads but the sampling one, or the loop's thread


@dataclass(frozen=True, kw_only=True)
class Activity:
    """The verdict over one window."""

    computing: bool
    seconds: float
    cpu: float  # share of one core (of the process's threads but the watchdog's: above 1 with intra-op threads)
    runnable: tuple[int, int] | None  # (samples where a thread was runnable, samples)
    gpu: str | None
    where: str | None
    collective: str | None

    def describe(self) -> str:
        runnable = f", runnable at {self.runnable[0]} of {self.runnable[1]} looks" if self.runnable else ""
        parts = [f"{self.cpu:.0%} CPU{runnable} over the last {duration(self.seconds)}"]
        if self.gpu is not None:
            parts.append(f"GPU: {self.gpu}")
        if self.collective:
            parts.append(f"inside torch.distributed's {self.collective}")
        elif self.where:
            parts.append(f"inside {self.where}")
        return ", ".join(parts)


class ActivityWindow:
    """Samples of the rank's process, kept for `seconds`, taken by the thread that calls sample() (the watchdog's,
    whose own work is left out); full samples (the threads' states, the loop's stack, the GPU) only when asked.
    `thread`: the loop's (by default the one that builds the window), whose stack says where the rank is.

    Whose work counts: in a batch's forward and backward (`process`), every thread's but the sampling one (torch's
    intra-op threads do a CPU forward's work while the loop's thread waits at their barrier); anywhere else (fetching
    a batch, a checkpoint, the step's end) the loop's thread alone: the threads of Horovod's and DeepSpeed's
    communication poll on their own, and a rank whose loop sleeps in its dataset is waiting, however busy they are."""

    def __init__(self, device: torch.device | None, seconds: float, thread: threading.Thread | None = None):
        thread = thread or threading.current_thread()
        self.thread_id, self.device, self.seconds = thread.ident, device, seconds
        self.native_id = thread.native_id
        self._samples: deque[Sample] = deque()

    def sample(self, now: float, full: bool, process: bool = True) -> None:
        """process: whether the rank's work is its process's (a batch's forward and backward) or its loop thread's."""
        if self._samples and self._samples[-1].process != process:  # another scope: its clock starts afresh
            self._samples.clear()
        cpu = others_cpu_seconds() if process else thread_cpu_seconds(self.thread_id)
        if full:
            where, collective = self._where()
            running = a_thread_runnable() if process else thread_runnable(self.native_id)
            self._samples.append(Sample(wall=now, cpu=cpu, full=True, running=running, where=where,
                                        collective=collective, gpu=work_in_flight(self.device), process=process))
        else:
            self._samples.append(Sample(wall=now, cpu=cpu, process=process))
        while len(self._samples) > 2 and self._samples[1].wall <= now - self.seconds:  # one at or before its start
            self._samples.popleft()

    def verdict(self) -> Activity | None:
        """None until two full samples are in the window (a watchdog that missed ticks on a busy machine waits)."""
        full = [s for s in self._samples if s.full]
        if len(full) < 2:
            return None
        first, last = full[0], full[-1]
        cpu = max(0.0, last.cpu - first.cpu) / max(last.wall - first.wall, 1e-9)  # two clocks: not read at once
        states = [s.running for s in full if s.running is not None]
        runnable = (sum(states), len(states)) if states else None
        gpus = [s.gpu for s in full if s.gpu is not None]
        in_flight = _most(g == IN_FLIGHT for g in gpus)
        gpu = (IN_FLIGHT if in_flight else gpus[-1]) if gpus else None
        parked = all(s.collective for s in full)
        computing = not parked and (_most(states) or cpu >= CPU_BUSY or in_flight)
        return Activity(computing=computing, seconds=last.wall - first.wall, cpu=cpu, runnable=runnable, gpu=gpu,
                        where=last.where, collective=last.collective if parked else None)

    def _where(self) -> tuple[str | None, str | None]:
        frame = sys._current_frames().get(self.thread_id)  # documented for debuggers: a blocked thread's stack
        where = collective = None
        while frame is not None and (where is None or collective is None):
            code = frame.f_code
            if collective is None and code.co_filename.endswith(_COLLECTIVE_FILES):
                collective = code.co_name
            if where is None and code.co_name == "forward" and not code.co_filename.startswith(_TORCH):
                name = getattr(code, "co_qualname", code.co_name)  # Python 3.11+
                where = f"{name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})"
            frame = frame.f_back
        return where, collective


def _most(flags) -> bool:
    flags = list(flags)
    return 2 * sum(flags) > len(flags)


def others_cpu_seconds() -> float:
    """CPU seconds so far of this process's threads but the calling one."""
    return time.process_time() - time.thread_time()


def thread_cpu_seconds(thread_id: int) -> float:
    """CPU seconds so far of one thread of this process (by its threading ident, a pthread id)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread_id))
    except (OSError, AttributeError):  # a thread that ended; a platform without per-thread clocks
        return 0.0


def thread_runnable(native_id: int | None) -> bool | None:
    """Whether one thread of this process is runnable now; None where there is no /proc."""
    try:
        with open(f"/proc/self/task/{native_id}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "R"  # the name before it may hold spaces
    except (OSError, IndexError):
        return None


def a_thread_runnable() -> bool | None:
    """Whether a thread of this process but the calling one is runnable now; None where there is no /proc."""
    me = threading.get_native_id()
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    for task in tasks:
        if task == str(me):
            continue
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] == "R":  # the name before it may hold spaces
                    return True
        except (OSError, IndexError):  # a thread that ended meanwhile
            continue
    return False


def work_in_flight(device: torch.device | None) -> str | None:
    """Whether the rank's GPU has work queued on its default stream (what the loop's kernels run on unless the
    user's code picks another stream); None on a CPU rank. Asked of the rank's own device, by index: this thread's
    current device is not the loop's."""
    if device is None or device.type != "cuda":
        return None
    try:
        return IDLE if torch.cuda.default_stream(device).query() else IN_FLIGHT
    except RuntimeError as exc:  # a device that faulted: said, and counted as not computing
        return f"no answer: {first_line(exc)}"


class BatchSpeed:
    """Samples/s of the loop's slow batches, from what the heartbeat shows at each tick: a batch seen running at two
    ticks or more took from its beat to the first tick that saw it gone (to within a tick)."""

    def __init__(self):
        self._unit: tuple | None = None  # (since, phase, samples, ticks seen)
        self._finished: dict[str, tuple[int, float]] = {}  # phase -> (samples, seconds) of its last slow batch

    def observe(self, heartbeat, now: float) -> None:
        since, phase, batch = heartbeat.since, heartbeat.phase, heartbeat.batch
        if self._unit is not None and self._unit[0] == since:
            self._unit = (*self._unit[:3], self._unit[3] + 1)
            return
        if self._unit is not None and self._unit[2] and self._unit[3] >= 2:
            self._finished[self._unit[1]] = (self._unit[2], now - self._unit[0])
        self._unit = (since, phase, _samples(batch) if phase in BATCH_PHASES else None, 1)

    def describe(self, now: float) -> str | None:
        """Its last slow batch's speed in this phase, or a bound from the batch running now; None out of a batch."""
        if self._unit is None or not self._unit[2]:
            return None
        since, phase, samples, _ = self._unit
        if phase in self._finished:
            done, took = self._finished[phase]
            return f"{done / took:.3g} samples/s (its last batch: {done} samples in {duration(took)})"
        running = now - since
        return f"at most {samples / running:.3g} samples/s (a batch of {samples} running for {duration(running)})"


def duration(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def _samples(batch) -> int | None:
    if batch is None:
        return None
    try:
        return batch_size(batch)
    except ValueError:  # a batch without a tensor: its speed is not said
        return None
