"""What the stall watchdog's window (framework/telemetry/activity.py) sees of a thread inside a real torch.distributed
collective on a gloo world of 2: rank 1's thread waits in a barrier that rank 0 enters only once rank 1 has looked
at it. The window must find it there by torch's own file, and call it waiting, not computing."""
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from framework.telemetry.activity import ActivityWindow


def _inside_the_barrier(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code.co_name != "barrier":
        frame = frame.f_back
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    return frame is not None and stat.rpartition(")")[2].split()[0] == "S"


def _window_over_a_thread_in_a_barrier(rank: int, world_size: int, looked: str):
    if rank == 0:  # enters the barrier once rank 1 has its verdict: the window looks at a wait that is real
        deadline = time.monotonic() + 20
        while not Path(looked).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        dist.barrier()
        return None
    thread = threading.Thread(target=dist.barrier)
    thread.start()
    deadline = time.monotonic() + 20
    while not _inside_the_barrier(thread):
        assert time.monotonic() < deadline, "rank 1's thread never waited in the barrier"
        time.sleep(0.02)
    window = ActivityWindow(None, 30.0, thread)
    for _ in range(4):
        window.sample(time.monotonic(), full=True)
        time.sleep(0.1)
    activity = window.verdict()
    Path(looked).touch()
    thread.join(30)
    return activity.computing, activity.collective, activity.runnable, activity.describe()


def test_a_thread_waiting_in_a_gloo_barrier_is_waiting_inside_torch_distributed(world2, tmp_path):
    _, (computing, collective, runnable, said) = world2.run(_window_over_a_thread_in_a_barrier,
                                                            str(tmp_path / "looked"))
    # parked in a collective is waiting whatever else runs: the world's own threads may be runnable at a look on a
    # loaded machine (1 of 4 seen in a make test-all), and that must not make it computing
    assert not computing and collective == "barrier" and runnable[1] == 4, said
    assert said.endswith("inside torch.distributed's barrier"), said
