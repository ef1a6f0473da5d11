"""The stall watchdog's parts in this process: its timeouts refused in the driver, what a stalled rank on nccl dumps
(the flight recorder) before it exits, and how it tells a rank that computes (slow) from one that waits (stalled):
a real watchdog over a real thread that computes or blocks, the GPU's branch forced (no GPU here), the speed of a
slow batch, the verdict over every rank's position. Stalled and slow runs: tests/runs/test_stall.py; a rank parked in
a collective: tests/dist/test_stall_activity.py."""
import contextlib
import os
import re
import threading
import time

import pytest
import torch

from framework.telemetry import stall
from framework.telemetry.activity import CPU_BUSY, IN_FLIGHT, ActivityWindow, BatchSpeed, a_thread_runnable


@pytest.mark.parametrize("args,message", [
    (["trainer.stall_timeout=0"], "trainer.stall_timeout=0.0 is not allowed: expected a number > 0 or null"),
    (["strategy=ddp", "trainer.stall_timeout=700", "strategy.timeout=600"],
     "strategy.timeout=600 must be longer than trainer.stall_timeout=700"),
])
def test_bad_timeouts_are_refused_in_the_driver(tmp_path, args, message):
    from support.driver import driver_says

    assert message in driver_says(args, tmp_path)


def test_a_stalled_rank_on_nccl_dumps_the_flight_recorder_before_it_exits(tmp_path, monkeypatch):
    """The watchdog (stall_timeout < strategy.timeout) ends a stalled rank before NCCL's own timeout would dump its
    flight recorder, so it dumps it itself, where torch would (TORCH_FR_DUMP_TEMP_FILE + rank), before the exit.
    NCCL's trace function and the exit are the two things replaced here: no GPU, and the test must go on."""
    import torch._C._distributed_c10d as c10d

    fresh = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FR_", "TORCH_NCCL_"))}
    monkeypatch.setattr(os, "environ", fresh)  # what the worker sets stays in this test
    stall.nccl_flight_recorder(tmp_path)
    monkeypatch.setattr(c10d, "_dump_nccl_trace", lambda *a, **k: b"nccl trace of rank 0", raising=False)
    dumped_before_exit = []
    monkeypatch.setattr(stall, "exit_now", lambda code: dumped_before_exit.append(
        (code, (tmp_path / "nccl_flight_recorder" / "rank_0").read_bytes())))
    watchdog = stall.StallWatchdog(stall.Heartbeat(), stall.StallSeat(tmp_path, 0, 1), 1.0, lambda m: None,
                                   lambda: None, prints_summary=False,
                                   before_exit=lambda: stall.dump_nccl_flight_recorder(0))
    watchdog._end_stalled_run(idle=1.5)
    assert dumped_before_exit == [(stall.EXIT_STALLED, b"nccl trace of rank 0")]
    assert (tmp_path / "stall" / "rank0.txt").is_file()


@contextlib.contextmanager
def _thread(work):
    """A thread running work(stop) until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=work, args=(stop,), daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(30)


def _compute(stop: threading.Event, heartbeat=None) -> None:  # torch's kernels, as a forward runs them (no GIL)
    a = torch.randn(128, 128)
    while not stop.is_set():
        a = torch.tanh(a @ a)


def _block(stop: threading.Event, heartbeat=None) -> None:  # a lock, a queue, a socket: asleep
    stop.wait()


def _asleep(thread: threading.Thread) -> None:
    """Returns once the thread sleeps in its wait (a thread just started is runnable until it gets there)."""
    stat = f"/proc/self/task/{thread.native_id}/stat"
    deadline = time.monotonic() + 30
    while open(stat).read().rpartition(")")[2].split()[0] != "S":
        assert time.monotonic() < deadline, "the thread never blocked"
        time.sleep(0.01)


def _sampled(window: ActivityWindow, samples: int = 4):
    for _ in range(samples):
        window.sample(time.monotonic(), full=True)
        time.sleep(0.05)
    return window.verdict()


def test_a_thread_that_computes_is_computing_and_one_that_blocks_is_waiting():
    with _thread(_compute) as thread:
        busy = _sampled(ActivityWindow(None, 10.0, thread))
    with _thread(_block) as thread:
        _asleep(thread)
        # the loop's thread alone: torch's OpenMP threads spin a while after busy's kernels, runnable in the process
        blocked = _sampled_as(ActivityWindow(None, 10.0, thread), process=False)
    assert busy.computing and busy.runnable[0] >= 3, busy
    assert not blocked.computing and blocked.runnable == (0, 4) and blocked.cpu < 0.01, blocked
    assert blocked.describe().startswith("0% CPU, runnable at 0 of 4 looks over the last ")


def test_a_loop_asleep_beside_a_polling_thread_waits_out_of_a_batch_and_computes_in_one():
    """Horovod's background thread and DeepSpeed's communication poll on their own: out of a batch's forward and
    backward (fetching data, here) only the loop's thread counts, so a loop asleep in its dataset is waiting however
    busy they are (a stalled horovod run was called slow for good); in a batch, the process's threads count, as
    torch's intra-op threads do the forward's work while the loop's thread waits at their barrier."""
    with _thread(_block) as loop, _thread(_compute):
        _asleep(loop)
        fetching = _sampled_as(ActivityWindow(None, 10.0, loop), process=False)
        in_batch = _sampled_as(ActivityWindow(None, 10.0, loop), process=True)
    assert not fetching.computing and fetching.runnable == (0, 4) and fetching.cpu < 0.01, fetching
    assert in_batch.computing, in_batch


def _sampled_as(window: ActivityWindow, process: bool, samples: int = 4):
    for _ in range(samples):
        window.sample(time.monotonic(), full=True, process=process)
        time.sleep(0.05)
    return window.verdict()


def _spinning_collective():
    """A function torch.distributed's file would hold, spinning as a CUDA sync spins while NCCL waits for a peer:
    compiled under that file's name, so the window finds the thread inside torch.distributed's all_reduce."""
    namespace = {}
    exec(compile("def all_reduce(stop):\n    while not stop.is_set():\n        pass\n",
                 os.path.join("site-packages", "torch", "distributed", "distributed_c10d.py"), "exec"), namespace)
    return namespace["all_reduce"]


def test_a_thread_that_spins_inside_a_collective_is_waiting_not_computing():
    with _thread(_spinning_collective()) as thread:
        parked = _sampled(ActivityWindow(None, 10.0, thread))
    assert parked.runnable[0] >= 3 and parked.collective == "all_reduce" and not parked.computing, parked
    assert "inside torch.distributed's all_reduce" in parked.describe()


class _Stream:
    def __init__(self, state: str):
        self.state = state

    def query(self) -> bool:
        if self.state == "faulted":
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        return self.state == "idle"


def test_on_a_gpu_a_kernel_in_flight_is_computing_asked_of_the_ranks_own_device(monkeypatch):
    """No GPU here: torch.cuda's stream is replaced, so the GPU's branch runs. The thread itself sleeps: only its
    GPU's work makes it a computing rank. The rank's device (cuda:1) is asked, not this thread's current one."""
    asked, state = [], ["in flight"]
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device: asked.append(device) or _Stream(state[0]))
    gpu = torch.device("cuda", 1)
    with _thread(_block) as thread:
        _asleep(thread)
        in_flight = _sampled(ActivityWindow(gpu, 10.0, thread))
        state[0] = "idle"
        idle = _sampled(ActivityWindow(gpu, 10.0, thread))
        state[0] = "faulted"
        faulted = _sampled(ActivityWindow(gpu, 10.0, thread))
    assert in_flight.computing and in_flight.gpu == IN_FLIGHT and "GPU: a kernel in flight" in in_flight.describe()
    assert not idle.computing and idle.gpu == "idle"
    assert not faulted.computing and faulted.gpu == "no answer: CUDA error: an illegal memory access was encountered"
    assert set(asked) == {gpu}


def _watched_loop(tmp_path, work, device=None, seconds: float = 3.0):
    """A loop thread under a real StallWatchdog (timeout 1 s), at step 1's forward with a batch of 8, doing `work`
    until the watchdog ends the run (exit_now: recorded, and the watchdog stopped as the process would be) or
    `seconds` pass. What the watchdog said, and its exit codes."""
    said, exits, ended, watchdogs = [], [], threading.Event(), []

    def exit_now(code):
        exits.append(code)
        ended.set()
        watchdogs[0].stop(join=False)  # its thread ends after this tick, as with the process

    def loop():
        heartbeat = stall.Heartbeat(device)
        seat = stall.StallSeat(tmp_path, 0, 1)
        watchdogs.append(stall.StallWatchdog(heartbeat, seat, 1.0, said.append, lambda: None,
                                             prints_summary=False).start())
        heartbeat.beat(1, "compute", torch.zeros(8, 3))
        timer = threading.Timer(seconds, ended.set)
        timer.start()
        work(ended, heartbeat)  # in the thread the watchdog watches
        timer.cancel()
        watchdogs[0].stop()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stall, "exit_now", exit_now)
        thread = threading.Thread(target=loop)
        thread.start()
        thread.join(60)
    return said, exits


def test_past_the_timeout_a_loop_that_computes_is_slow_and_goes_on(tmp_path):
    said, exits = _watched_loop(tmp_path, _compute)
    assert not exits
    slow = [m for m in said if m.startswith("rank 0 is slow, not stalled: ")]
    assert slow and re.match(r"rank 0 is slow, not stalled: at most [\d.]+ samples/s \(a batch of 8 running for "
                             r"[\d.]+ s\), \d+% CPU, runnable at \d+ of \d+ looks over the last [\d.]+ s; at step 1, "
                             r"forward/backward for [\d.]+ s", slow[0]), said
    assert not (tmp_path / "stall").exists()


def _quiet_process() -> None:
    """Returns once no other thread of this process is runnable at 10 looks in a row: in a batch the watchdog
    counts the whole process, and torch's OpenMP threads from an earlier test's kernels spin a while (longer on a
    loaded machine, where a spinning thread waits for a core) before they sleep."""
    deadline, quiet = time.monotonic() + 30, 0
    while quiet < 10:
        assert time.monotonic() < deadline, "a thread of this process never stopped running"
        quiet = 0 if a_thread_runnable() else quiet + 1
        time.sleep(0.02)


def test_past_the_timeout_a_loop_that_waits_is_stalled(tmp_path):
    _quiet_process()
    said, exits = _watched_loop(tmp_path, _block, seconds=30)
    assert exits == [stall.EXIT_STALLED] and not said
    summary = (tmp_path / "stall" / "summary.txt").read_text()
    # the process's other threads (pytest's, xdist's) may use a little CPU and run at a look on a loaded machine:
    # below the busy bound it is waiting, which the stall verdict above already says
    found = re.search(r"rank 0 \(.*\) at step 1, forward/backward: .*; waiting: (\d+)% CPU, "
                      r"runnable at \d+ of \d+ looks", summary)
    assert found and int(found[1]) < 100 * CPU_BUSY, summary


def test_a_waiting_loop_whose_gpu_has_work_in_flight_is_slow(tmp_path, monkeypatch):
    """The rank's device goes from its heartbeat to the watchdog's window: its thread sleeps, its GPU computes."""
    monkeypatch.setattr(torch.cuda, "default_stream", lambda device: _Stream("in flight"))
    said, exits = _watched_loop(tmp_path, _block, device=torch.device("cuda", 1))
    assert not exits and any("GPU: a kernel in flight" in m for m in said), said


def _slow_steps(stop: threading.Event, heartbeat) -> None:
    """Steps of 1.2 s, asleep (a slow disk, a callback that waits), each phase moving on after 0.3 s."""
    step = 1
    while not stop.is_set():
        for phase in ("data", "compute", "step_end", "log"):
            heartbeat.beat(step, phase, torch.zeros(8, 3) if phase == "compute" else None)
            stop.wait(0.3)
        step += 1


def test_steps_slower_than_the_timeout_whose_phases_move_on_are_neither_stalled_nor_slow(tmp_path):
    """The watchdog's clock runs from the loop's last move, not from the step's start: a step longer than the
    timeout that progresses is left alone, however little it computes."""
    said, exits = _watched_loop(tmp_path, _slow_steps, seconds=4.0)
    assert not exits and not said, said
    assert not (tmp_path / "stall").exists()


NOW = 1000.0  # time.time() when rank 0 reads the positions


def _at(step: int, phase: str, idle: float, computing: bool | None = None, written: float = NOW) -> dict:
    position = {"step": step, "phase": phase, "idle": idle, "time": written}
    return position if computing is None else {**position, "computing": computing}


@pytest.mark.parametrize("positions,progressing", [
    ({0: _at(5, "compute", 9, False), 1: _at(5, "compute", 9, True)}, [1]),  # 0 waits inside the step for 1
    ({0: _at(5, "compute", 9, False), 1: _at(5, "data", 9, False)}, []),  # 1 stuck on its data
    ({0: _at(6, "compute", 9, True), 1: _at(5, "step_end", 9, False)}, []),  # computing ahead of a stuck rank
    ({0: _at(5, "compute", 9, False), 1: _at(5, "data", 2)}, [1]),  # 1 moved on 2 s ago: not judged yet
    ({0: _at(5, "compute", 9, False), 1: _at(5, "compute", 9)}, [1]),  # 1's watchdog has not looked twice yet
    # 1's watchdog went silent (a frozen process, a C call holding the GIL): idle since its last position, and its
    # last verdict counts for less than half the timeout
    ({0: _at(5, "compute", 9, False), 1: _at(5, "data", 2, written=NOW - 7)}, []),
    ({0: _at(5, "compute", 9, False), 1: _at(5, "compute", 9, written=NOW - 5)}, []),
    ({0: _at(5, "compute", 9, False), 1: _at(5, "compute", 9, True, written=NOW - 3)}, [1]),
    ({0: _at(5, "compute", 9, False), 1: _at(5, "compute", 9, True, written=NOW - 5)}, []),
])
def test_a_run_stalls_when_no_rank_the_others_wait_for_moves_or_computes(positions, progressing):
    assert stall.progressing_ranks(positions, timeout=8, now=NOW) == progressing


def test_a_slow_batchs_speed_is_measured_from_the_ticks_that_saw_it():
    heartbeat, speed = stall.Heartbeat(), BatchSpeed()

    def beat(step, phase, at, batch=None):
        heartbeat.beat(step, phase, batch)
        heartbeat.since = at

    beat(1, "compute", 100.0, torch.zeros(8, 3))
    speed.observe(heartbeat, 100.2)
    speed.observe(heartbeat, 100.4)
    assert speed.describe(100.4) == "at most 20 samples/s (a batch of 8 running for 0.4 s)"
    beat(1, "step_end", 101.9)  # the batch ended between the ticks at 100.4 and 102.0
    speed.observe(heartbeat, 102.0)
    assert speed.describe(102.0) is None  # out of a batch
    beat(2, "compute", 102.1, torch.zeros(8, 3))
    speed.observe(heartbeat, 102.2)
    assert speed.describe(103.0) == "4 samples/s (its last batch: 8 samples in 2.0 s)"
    beat(2, "evaluate", 103.1, {"x": torch.zeros(32, 3)})  # another phase: its own speed
    speed.observe(heartbeat, 104.0)
    assert speed.describe(105.1) == "at most 16 samples/s (a batch of 32 running for 2.0 s)"
