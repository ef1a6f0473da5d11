"""The stall watchdog's parts in this process: its timeouts refused in the driver, and what a stalled rank on nccl
dumps (the flight recorder) before it exits. Stalled runs: tests/runs/test_stall.py."""
import os

import pytest


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

    from framework.telemetry import stall

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
