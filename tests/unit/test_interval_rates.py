"""What a log boundary's rates mean when the ranks' own windows differ (each process times from its reset to its
rows(), and the ranks reach a boundary at different moments): every rate is over the interval's wall time, so the
ranks' samples/s, tokens/s and the run's per-rank totals add up to the job's exactly. Issue 53 item 7: a pipeline
run's ranks summed to 349.9 samples/s against the job's 333.0, each rank's rate being over its own, shorter window."""
import pytest
import torch

from framework.telemetry.meter import MeterSources, StepRecord
from framework.telemetry.meters import COLUMNS, IntervalMeter, IntervalSummary
from framework.telemetry.per_gpu import PerGpu, Slot
from framework.telemetry.scalars import interval_scalars
from framework.training.loop_state import RunTotals

BATCH = 16  # trainer.batch_size of tests/engines/test_model_parallel.py: two pipeline stages, 2 micro-batches a step
# the failing run's last interval: a 333.0 samples/s step (rank 0's window), rank 1's window 9% shorter
WINDOWS = (BATCH / 333.0, BATCH / 2 / (349.9 - 333.0 / 2))


def _pipeline_rows(windows=WINDOWS, tokens_per_sample=None) -> torch.Tensor:
    """The gathered rows of one step of 2 pipeline stages: both see the step's samples and count half of them
    (IntervalMeter's share), each with its own window."""
    rows = []
    for _ in windows:
        meter = IntervalMeter(MeterSources([BATCH // 2], torch.device("cpu"), share=0.5))
        micro_batches = 2  # the loop's
        tokens = [BATCH // 2 * tokens_per_sample if tokens_per_sample else None] * micro_batches
        meter.add(StepRecord(1, [torch.full((BATCH // 2,), 2.0)] * micro_batches, tokens))
        rows.append(meter.rows())
    rows = torch.cat(rows)
    rows[:, COLUMNS.index("seconds")] = torch.tensor(windows, dtype=rows.dtype)
    return rows


def test_the_ranks_rates_add_up_to_the_jobs_when_their_windows_differ():
    s = IntervalSummary.from_rows(_pipeline_rows())
    assert s.per_slot_samples == [BATCH / 2, BATCH / 2] and s.samples == BATCH, "each stage counts its share"
    assert s.seconds == max(WINDOWS) and s.columns["seconds"] == list(WINDOWS)
    own = [n / t for n, t in zip(s.per_slot_samples, s.columns["seconds"])]
    assert (s.samples_per_sec, sum(own)) == pytest.approx((333.0, 349.9)), "rates over their own windows: the failure"
    assert sum(s.per_slot_samples_per_sec) == pytest.approx(s.samples_per_sec, rel=1e-12)
    assert s.per_slot_samples_per_sec == pytest.approx([BATCH / 2 / max(WINDOWS)] * 2, rel=1e-12)
    tags = interval_scalars(s, 0.1)
    assert tags["throughput/samples_per_sec/rank0"] + tags["throughput/samples_per_sec/rank1"] == pytest.approx(
        tags["throughput/samples_per_sec"], rel=1e-12)


def test_tokens_and_tflops_per_rank_are_over_the_same_wall_time():
    s = IntervalSummary.from_rows(_pipeline_rows(tokens_per_sample=32))
    tags = interval_scalars(s, 0.1)
    assert tags["throughput/tokens_per_sec/rank0"] + tags["throughput/tokens_per_sec/rank1"] == pytest.approx(
        tags["throughput/tokens_per_sec"], rel=1e-12)
    assert tags["throughput/tokens_per_sec"] == pytest.approx(BATCH * 32 / max(WINDOWS), rel=1e-12)
    per_gpu = PerGpu([Slot("vm", "cpu", "cpu", None)] * 2, flops_per_sample=3e9, straggler_threshold=2.0)
    assert per_gpu.tflops(s) == pytest.approx([3e9 * rate / 1e12 for rate in s.per_slot_samples_per_sec], rel=1e-12)


def test_busy_stays_each_ranks_own_window():
    """What a rank did itself is out of its own window: the rank that reached the boundary sooner was busy less."""
    s = IntervalSummary.from_rows(_pipeline_rows())
    assert s.per_slot_busy_ms == pytest.approx([w * 1000 for w in WINDOWS], rel=1e-12)  # no wait clock given


def test_the_runs_per_rank_rates_add_up_to_its_rate():
    totals = RunTotals()
    for windows in (WINDOWS, WINDOWS[::-1], (0.05, 0.05)):
        totals.add(IntervalSummary.from_rows(_pipeline_rows(windows)))
    assert sum(totals.per_slot_samples_per_sec()) == pytest.approx(totals.samples / totals.seconds, rel=1e-12)


def test_the_runs_final_metrics_are_what_every_logger_writes_at_its_end():
    """TensorBoard's hparam/*, MLflow's and W&B's end-of-run metrics come from RunTotals, under these names."""
    totals = RunTotals(samples=300.0, seconds=1.5, val_loss=0.25, train_loss=0.5, val_metrics={"acc": 0.9})
    assert totals.final_metrics() == {"test_acc": 0.9, "test_loss": 0.25, "train_loss": 0.5}
    assert (totals.samples_per_sec, RunTotals().samples_per_sec) == (200.0, 0.0)
