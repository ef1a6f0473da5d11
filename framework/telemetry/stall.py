"""The stall watchdog (trainer.stall_timeout): when the ranks the others wait for have not moved on for that long
and are not computing either (framework/telemetry/activity.py), every rank's Python stack goes to
<run folder>/stall/rank<r>.txt, rank 0 names the rank(s) behind the others with their innermost frame in the user's
code, and every worker ends (exit code EXIT_STALLED); the checkpoints written before stay. A rank past the timeout
that computes is slow, not stalled: rank 0 says so with its speed, and the watchdog watches on.

The process group is what hangs, so the ranks learn of each other through the run folder: a thread in every rank
writes where its loop is (step, phase, seconds since it last moved) to <run folder>/.heartbeat/rank<r>.json every
tick, and rank 0's thread reads them all. The loop itself only stores where it is (Heartbeat.beat: two attributes and
a clock read per phase), and the thread takes the stacks (sys._current_frames, which works while the main thread is
blocked in user code or inside a collective)."""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from framework.session.exit import exit_now
from framework.telemetry.activity import BATCH_PHASES, ActivityWindow, BatchSpeed, duration

STALL_DIR, HEARTBEAT_DIR, SUMMARY = "stall", ".heartbeat", "summary.txt"
_DRIVER_PID = "HYDRA_DIST_DRIVER_PID"
EXIT_STALLED = 75
# the order of a step's phases: a rank at an earlier one did not reach what the later ones wait in
PHASES = {"start": 0, "data": 1, "compute": 2, "step_end": 3, "log": 4, "checkpoint": 5, "evaluate": 6}
DOING = {"start": "starting", "data": "fetching its batch from the data loader", "compute": "forward/backward",
         "step_end": "ending the step (optimizer step done, callbacks)", "log": "gathering the log interval's meters",
         "checkpoint": "writing a checkpoint", "evaluate": "evaluating"}
_LIBRARIES = (os.path.dirname(os.__file__), "site-packages", "dist-packages", "<frozen")
_FRAMEWORK = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mark_driver_process() -> None:
    """The driver says so to the processes it starts: their stall summary goes through it (framework/run.py), while a
    driver that trains itself (single, dp, rank 0 under torchrun and the like) prints it from its watchdog."""
    os.environ[_DRIVER_PID] = str(os.getpid())


@dataclass(frozen=True)
class StallSeat:
    """Where a rank's watchdog keeps its heartbeats and stacks (the run folder), and whose it reads."""

    run_dir: Path
    rank: int
    world_size: int


@contextlib.contextmanager
def watch_for_stalls(timeout: float | None, heartbeat: "Heartbeat", seat: StallSeat, say, last_checkpoint,
                     before_exit=None):
    """A StallWatchdog around the loop on every rank (none with trainer.stall_timeout=null). before_exit: what the
    watchdog does last before it ends a stalled rank (dump_nccl_flight_recorder on nccl)."""
    if timeout is None:
        yield
        return
    watchdog = StallWatchdog(heartbeat, seat, timeout, say, last_checkpoint,
                             prints_summary=os.environ.get(_DRIVER_PID) == str(os.getpid()),
                             before_exit=before_exit).start()
    try:
        yield
    except BaseException:
        watchdog.stop(join=False)  # a signal or an error ends the worker: nothing may delay it
        raise
    watchdog.stop()


class Heartbeat:
    """Where this rank's loop is, and the batch it computes (in the compute and evaluate phases: what the watchdog
    counts a slow batch's samples from); written by the loop's thread, read by the watchdog's. `device`: the rank's
    (a GPU's work in flight counts as computing)."""

    __slots__ = ("step", "phase", "since", "batch", "device")

    def __init__(self, device=None):
        self.step, self.phase, self.since, self.batch, self.device = 0, "start", time.monotonic(), None, device

    def beat(self, step: int, phase: str, batch=None) -> None:
        self.step, self.phase, self.batch, self.since = step, phase, batch, time.monotonic()


class StallWatchdog:
    """Built in the loop's thread, which it watches."""

    def __init__(self, heartbeat: Heartbeat, seat: StallSeat, timeout: float, say, last_checkpoint, *,
                 prints_summary: bool, before_exit=None):
        run_dir, rank, world_size = seat.run_dir, seat.rank, seat.world_size
        self.heartbeat, self.rank, self.world_size, self.timeout = heartbeat, rank, world_size, timeout
        self.say, self.last_checkpoint, self.prints_summary = say, last_checkpoint, prints_summary
        self.before_exit = before_exit
        self.beats, self.stall = run_dir / HEARTBEAT_DIR, run_dir / STALL_DIR
        self.host, self.pid = os.uname().nodename, os.getpid()
        self.tick = min(5.0, max(0.2, timeout / 20))
        self.warn_after = timeout / 3
        # what a rank did over the last `window` s decides, at the timeout, whether it computes or waits
        self.window = min(60.0, timeout / 2)
        self._stopped = threading.Event()
        self.activity = ActivityWindow(heartbeat.device, self.window)
        self._main = self.activity.thread_id
        self.speed = BatchSpeed()
        self._warned_at: tuple | None = None
        self._said_slow: set[tuple] = set()
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)

    def start(self) -> "StallWatchdog":
        self.heartbeat.since = time.monotonic()  # the clock starts with the loop (not at a resume's loading)
        (self.beats / f"rank{self.rank}.json").unlink(missing_ok=True)  # an earlier run's, stalled in this folder
        self._thread.start()
        return self

    def stop(self, join: bool = True) -> None:
        self._stopped.set()
        if join and self._thread.is_alive():
            self._thread.join(timeout=2 * self.tick)
        (self.beats / f"rank{self.rank}.json").unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # the last rank out takes the folder
            self.beats.rmdir()

    def _watch(self) -> None:
        # Signals for the main thread land there: taken by this thread, SIGINT/SIGTERM left a main thread blocked in a
        # collective uninterrupted (workers outlived the agent's 30 s grace in about 1 of 7 stops)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1})
        while not self._stopped.wait(self.tick):
            self._tick(time.monotonic())

    def _tick(self, now: float) -> None:
        idle = now - self.heartbeat.since
        self.speed.observe(self.heartbeat, now)
        self.activity.sample(now, full=idle >= self.timeout - self.window,
                             process=self.heartbeat.phase in BATCH_PHASES)
        position = self._position(idle, now)
        self._write_position(position)
        if idle < (self.warn_after if self.rank == 0 else self.timeout):
            return
        positions = {**self._positions(), self.rank: position}
        if self.rank == 0:
            self._say_slow(positions)
            self._warn_waiting(idle, positions)
        if idle >= self.timeout and "computing" in position and self._stalled(positions):
            self._end_stalled_run(idle, position)

    def _position(self, idle: float, now: float) -> dict:
        position = {"rank": self.rank, "step": self.heartbeat.step, "phase": self.heartbeat.phase, "idle": idle,
                    "host": self.host, "pid": self.pid, "time": time.time()}
        activity = self.activity.verdict() if idle >= self.timeout else None
        if activity is not None:
            position.update(computing=activity.computing, activity=activity.describe(),
                            speed=self.speed.describe(now))
        return position

    def _stalled(self, positions: dict[int, dict]) -> bool:
        """No rank the others wait for is moving or computing, or another rank already ended the run's stall."""
        if any(p.get("frame") for r, p in positions.items() if r != self.rank):
            return True
        return not progressing_ranks(positions, self.timeout, time.time())

    def _write_position(self, position: dict) -> None:
        self.beats.mkdir(parents=True, exist_ok=True)  # the last rank out of an earlier stop() may have taken it
        _write_json(self.beats / f"rank{self.rank}.json", position)

    def _positions(self) -> dict[int, dict]:
        found = {}
        for rank in range(self.world_size):
            try:
                found[rank] = json.loads((self.beats / f"rank{rank}.json").read_text())
            except (OSError, ValueError):
                pass
        return found

    def _say_slow(self, positions: dict[int, dict]) -> None:
        """Rank 0: each rank the others wait for that is past the timeout but computing, once per timeout."""
        for rank in behind_ranks(positions):
            p = positions[rank]
            key = (rank, p["step"], p["phase"], int(p["idle"] // self.timeout))
            if not p.get("computing") or key in self._said_slow:
                continue
            self._said_slow.add(key)
            speed = f"{p['speed']}, " if p.get("speed") else ""
            self.say(f"rank {rank} is slow, not stalled: {speed}{p['activity']}; at step {p['step']}, "
                     f"{DOING.get(p['phase'], p['phase'])} for {duration(p['idle'])} (trainer.stall_timeout="
                     f"{self.timeout:g} s ends a run whose ranks wait, not one that computes)")

    def _warn_waiting(self, idle: float, positions: dict[int, dict]) -> None:
        behind = behind_ranks(positions)
        if not behind or len(behind) == len(positions) or self._warned_at == _key(positions, behind):
            return
        self._warned_at = _key(positions, behind)
        first = positions[behind[0]]
        self.say(f"waiting for rank {_ranks(behind)} for {idle:.0f} s (at step {first['step']}, "
                 f"{DOING.get(first['phase'], first['phase'])}); the run ends at trainer.stall_timeout="
                 f"{self.timeout:g} s unless it is computing")

    def _end_stalled_run(self, idle: float, position: dict | None = None) -> None:
        stack, frame = self._stack()
        self.stall.mkdir(parents=True, exist_ok=True)
        position = {**(position or self._position(idle, time.monotonic())), "frame": frame}
        (self.stall / f"rank{self.rank}.txt").write_text(
            f"rank {self.rank} on {self.host} (pid {self.pid}): step {position['step']}, "
            f"{DOING.get(position['phase'], position['phase'])}, no progress for {idle:.0f} s"
            f"{_doing(position)}\n\n{stack}")
        self._write_position(position)
        for child in multiprocessing.active_children():  # DataLoader workers, maybe blocked in the same read: they
            child.kill()  # go first, so that no launcher's stop can leave them behind
        grace = max(10.0, 4 * self.tick)
        if self.rank == 0:
            _wait_for(self._every_rank_stalled, grace)
            summary = stall_summary(self._positions(), self.world_size, self.timeout, self.stall,
                                    self.last_checkpoint())
            _write_text(self.stall / SUMMARY, summary)
            if self.prints_summary:
                print(f"error: {summary}", file=sys.stderr, flush=True)
        else:  # rank 0 reads this rank's files before anyone leaves (the launcher stops the others at the first exit)
            _wait_for(lambda: (self.stall / SUMMARY).exists(), 2 * grace)
        if self.before_exit is not None:
            with contextlib.suppress(Exception):  # nothing may keep a stalled rank from ending
                self.before_exit()
        exit_now(EXIT_STALLED)

    def _every_rank_stalled(self) -> bool:
        """Every rank has written its stacks (its position carries its innermost frame)."""
        positions = self._positions()
        return len(positions) == self.world_size and all(p.get("frame") for p in positions.values())

    def _stack(self) -> tuple[str, str]:
        """Every thread's stack (the main thread's first), and the main thread's innermost frame in the user's code."""
        frames = sys._current_frames()  # documented for debuggers: the only way to read a blocked thread's stack
        names = {t.ident: t.name for t in threading.enumerate()}
        main = frames.get(self._main)
        parts = []
        for ident in sorted(frames, key=lambda i: i != self._main):
            if ident == threading.get_ident():
                continue
            parts.append(f"thread {names.get(ident, ident)}:\n" + "".join(traceback.format_stack(frames[ident])))
        return "\n".join(parts), innermost_frame(traceback.extract_stack(main)) if main else "?"


def innermost_frame(stack: traceback.StackSummary) -> str:
    """The innermost frame in the user's code (not a library's, not this framework's); failing that, the innermost
    outside the libraries (where the framework's loop waits); as 'file:line in function'."""
    outside = [f for f in stack if not f.filename.startswith("<") and not any(p in f.filename for p in _LIBRARIES)]
    users = [f for f in outside if not os.path.abspath(f.filename).startswith(_FRAMEWORK)]
    frame = (users or outside or list(stack) or [None])[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else "?"


def behind_ranks(positions: dict[int, dict]) -> list[int]:
    """The ranks whose loop is at the earliest (step, phase): those the others wait for."""
    if not positions:
        return []
    order = {r: (p["step"], PHASES.get(p["phase"], 0)) for r, p in positions.items()}
    earliest = min(order.values())
    return sorted(r for r, o in order.items() if o == earliest)


def progressing_ranks(positions: dict[int, dict], timeout: float, now: float) -> list[int]:
    """The ranks the others wait for that moved on within the timeout, or that are past it but were computing when
    their watchdog last wrote (or had not looked twice yet), less than half the timeout before `now` (time.time()).
    A rank whose watchdog went silent (its process frozen, or a C call holding the GIL) counts as idle since its last
    position, and as computing no longer."""
    progressing = []
    for rank in behind_ranks(positions):
        p = positions[rank]
        age = max(0.0, now - p["time"])
        if p["idle"] + age < timeout or (age < timeout / 2 and p.get("computing", True)):
            progressing.append(rank)
    return progressing


def stall_summary(positions: dict[int, dict], world_size: int, timeout: float, folder: Path, checkpoint) -> str:
    behind = behind_ranks(positions)
    lines = [f"the run stalled: no progress for trainer.stall_timeout={timeout:g} s"]
    if len(behind) < len(positions):
        lines.append(f"rank {_ranks(behind)} did not reach the step the others wait in:")
    elif len(positions) > 1:
        lines.append("every rank is at the same point: a collective they all entered did not finish, or each is "
                     "stuck on its own:")
    for rank in sorted(positions, key=lambda r: (r not in behind, r)):
        p = positions[rank]
        role = "" if len(behind) == len(positions) or rank in behind else "waiting: "
        lines.append(f"  {role}rank {rank} ({p['host']}, pid {p['pid']}) at step {p['step']}, "
                     f"{DOING.get(p['phase'], p['phase'])}: {p.get('frame', 'no stack written')}{_doing(p)}")
    missing = sorted(set(range(world_size)) - set(positions))
    if missing:
        lines.append(f"  rank {_ranks(missing)}: no position written (on another node without this run folder?)")
    kept = f"the last checkpoint is {checkpoint}" if checkpoint else "no checkpoint had been written yet"
    lines.append(f"every rank's stack: {folder}/rank<r>.txt; {kept}")
    return "\n".join(lines)


def stall_report(run_dir: Path, since: float) -> str | None:
    """The summary rank 0 wrote for a stall of a run launched at `since` (time.time()), for the driver to say."""
    path = Path(run_dir) / STALL_DIR / SUMMARY
    try:
        return path.read_text() if path.stat().st_mtime >= since else None
    except OSError:
        return None


def _doing(position: dict) -> str:
    """What the watchdog saw a rank do over the last window (nothing where it had not looked yet)."""
    if "activity" not in position:
        return ""
    return f"; {'computing' if position.get('computing') else 'waiting'}: {position['activity']}"


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _key(positions: dict, behind: list[int]) -> tuple:
    return tuple((r, positions[r]["step"], positions[r]["phase"]) for r in behind)


def _wait_for(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.1)


def _write_json(path: Path, value: dict) -> None:
    _write_text(path, json.dumps(value))


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


FLIGHT_RECORDER_DIR = "nccl_flight_recorder"
_FR_PREFIX = "TORCH_FR_DUMP_TEMP_FILE"


def nccl_flight_recorder(run_dir: Path) -> None:
    """On GPUs: torch's NCCL flight recorder keeps each rank's last collectives and dumps them to
    <run folder>/nccl_flight_recorder/rank_<r> when one times out (strategy.timeout), or when the stall watchdog ends
    a stalled run first (dump_nccl_flight_recorder). Read them with
    `python -m torch.distributed.flight_recorder.fr_trace <folder>`. Settings the user made win."""
    folder = run_dir / FLIGHT_RECORDER_DIR
    folder.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault(_FR_PREFIX, str(folder / "rank_"))


def dump_nccl_flight_recorder(rank: int) -> Path | None:
    """What NCCL's own timeout would have dumped, written now: the watchdog (stall_timeout < strategy.timeout by rule)
    ends a stalled rank with os._exit before NCCL's timeout fires, and NCCL's dump would never happen. Written where
    torch writes it (TORCH_FR_DUMP_TEMP_FILE + rank), in its format (the pickled trace fr_trace reads)."""
    prefix = os.environ.get(_FR_PREFIX)
    if not prefix:
        return None
    # torch has no public call for it: this is the one its own timeout dump and debug server use
    from torch._C._distributed_c10d import _dump_nccl_trace

    path = Path(f"{prefix}{rank}")
    path.write_bytes(_dump_nccl_trace())
    return path
