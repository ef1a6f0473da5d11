"""trainer.on_nonfinite=skip: an interval whose steps were all skipped logs no loss and no throughput (a loss of 0.0
and 0 samples/s read as a run that trained), train/skipped_steps says what happened, read back with TensorBoard's own
reader; a run that skips step after step stops (trainer.max_consecutive_skips) and the bound's bad values are one
line. The loop's stop as a real run: tests/runs/test_fault_tolerance.py."""
import pytest
import torch

from support.driver import driver_says
from support.run_files import read_scalars

CPU = torch.device("cpu")


def _logged(tmp_path, intervals: list[list[bool]]) -> dict[str, list[tuple[int, float]]]:
    """Each interval's steps (True: trained, False: skipped) through the meters and TensorBoard's writer; the
    scalars read back."""
    from framework.telemetry.meter import MeterSources, StepRecord
    from framework.telemetry.meters import IntervalMeter, IntervalSummary
    from framework.telemetry.tensorboard_logger import TensorBoardLogger

    meter, logger, step = IntervalMeter(MeterSources([4], CPU)), TensorBoardLogger(tmp_path, cuda=False), 0
    for interval in intervals:
        for trained in interval:
            step += 1
            meter.add(StepRecord(step, [torch.full((4,), 0.5)] if trained else [], skipped=not trained))
        summary = IntervalSummary.from_rows(meter.rows())
        meter.reset()
        logger.log_interval(step, summary, 0.1)
        logger.log_per_gpu(step, summary, [1.0], [None], [])
    logger.close()
    return read_scalars(tmp_path)


def test_an_interval_of_skipped_steps_has_no_loss_or_throughput_point_and_says_it_skipped(tmp_path):
    scalars = _logged(tmp_path, [[True, True], [False, False], [True, False]])
    assert scalars["loss/train"] == [(2, 0.5), (6, 0.5)], "no loss 0.0 at step 4"
    assert [s for s, _ in scalars["throughput/samples_per_sec"]] == [2, 6]
    assert [s for s, _ in scalars["loss/train/rank0"]] == [2, 6]
    assert [s for s, _ in scalars["throughput/device/tflops/rank0"]] == [2, 6]
    assert scalars["train/skipped_steps"] == [(4, 2.0), (6, 1.0)]
    assert [s for s, _ in scalars["time/step_ms"]] == [2, 4, 6], "the time the steps took is still logged"


def test_an_interval_of_skipped_steps_leaves_the_runs_train_loss_as_it_was():
    from framework.telemetry.meter import MeterSources, StepRecord
    from framework.telemetry.meters import IntervalMeter, IntervalSummary
    from framework.training.loop_state import RunTotals

    meter, totals = IntervalMeter(MeterSources([4], CPU)), RunTotals()
    for step, trained in enumerate([True, False], start=1):
        meter.add(StepRecord(step, [torch.full((4,), 0.25)] if trained else [], skipped=not trained))
        totals.add(IntervalSummary.from_rows(meter.rows()))
        meter.reset()
    assert totals.train_loss == 0.25


def test_the_streak_stops_at_the_bound_and_a_trained_step_ends_it():
    from framework.training.skips import SkipStreak

    streak = SkipStreak(3)
    said = [streak.record(step, stepped) for step, stepped in
            enumerate([False, False, True, False, False, False], start=1)]
    assert said[:5] == [None] * 5
    assert said[5] == ("3 optimizer steps in a row (steps 4 to 6) were skipped for a non-finite loss or gradient "
                       "(trainer.max_consecutive_skips=3): the run is not training")


@pytest.mark.parametrize("value,line", [
    ("0", "trainer.max_consecutive_skips=0 is not allowed: expected an integer >= 1"),
    ("many", "trainer.max_consecutive_skips='many' is not allowed"),
])
def test_bad_bounds_are_refused_in_one_line(tmp_path, value, line):
    said = driver_says([f"trainer.max_consecutive_skips={value}"], tmp_path)
    assert line in said and "\n" not in said
