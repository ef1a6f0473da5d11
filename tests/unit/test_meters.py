"""The meter protocol (framework/telemetry/meter.py): what every registered meter must do for the loop to run it
without knowing it (docs/architecture.md, "Add a telemetry number"), and one meter's tags reaching the loggers."""
import math

import pytest
import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord
from framework.telemetry.meter_registry import METERS
from framework.telemetry.meters import COLUMNS, FRAME, IntervalMeter, IntervalSummary
from framework.telemetry.memory_meter import MemoryMeter
from framework.telemetry.scalars import report_scalars
from framework.telemetry.per_gpu import IntervalReport
from framework.telemetry.wait_clock import WaitClock

CPU = torch.device("cpu")


def test_every_column_has_one_owner():
    assert len(COLUMNS) == len(set(COLUMNS)), "two meters (or a meter and the frame) name the same column"
    assert COLUMNS[:len(FRAME)] == FRAME


@pytest.mark.parametrize("meter", METERS, ids=lambda m: m.__name__)
def test_a_meter_with_nothing_to_count_gives_nan_columns_and_no_tags(meter):
    """An engine without the meter's source (no clock, no traffic, a step without tokens): NaN columns, and no tag
    rather than a misleading 0."""
    m = meter(MeterSources([3, 1], CPU))
    m.reset()
    m.add(StepRecord(1, [torch.ones(4)], [None]))
    rows = m.rows()
    assert rows.shape == (2, len(meter.columns)) and rows.dtype == torch.float64
    assert rows.isnan().all(), rows
    interval = Interval({name: rows[:, i] for i, name in enumerate(meter.columns)}, steps=1, seconds=1.0,
                        trained=True)
    assert meter.summary(interval) == {}


@pytest.mark.parametrize("meter", METERS, ids=lambda m: m.__name__)
def test_a_per_rank_tag_has_its_chart(meter):
    for charts in getattr(meter, "charts", {}).values():
        for title, regex in charts:
            assert regex.startswith("^") and regex.endswith("$"), (title, regex)


def test_a_meters_tags_reach_every_logger_with_the_frames():
    """The wait clock's meter: a rank that waited 30 ms in each of 2 steps reports time/wait_ms/rank0 = 30 beside
    the frame's tags, in what CSV, MLflow and W&B write (report_scalars) and TensorBoard (the same functions)."""
    clock = WaitClock(CPU)
    meter = IntervalMeter(MeterSources([4], CPU, clock=clock))
    for step in (1, 2):
        meter.add(StepRecord(step, [torch.full((4,), 0.5)]))
    clock.seconds = 0.06  # what its start/stop spans added up to (tests/unit/test_per_gpu_metrics.py times them)
    summary = IntervalSummary.from_rows(meter.rows())
    scalars = report_scalars(IntervalReport(summary, [1.0], [None], [], 1.2), 0.1)
    assert scalars["time/wait_ms/rank0"] == pytest.approx(30.0)
    assert "time/busy_ms/rank0" in scalars  # the frame's: the rank's window less the wait meter's columns
    assert scalars["loss/train"] == 0.5 and "throughput/samples_per_sec" in scalars
    assert not [tag for tag in scalars if tag.startswith(("time/forward", "time/comm", "comm/", "throughput/tokens"))]
    meter.reset()
    assert clock.read() == 0.0, "the frame resets every meter, and the wait meter its clock"
    assert math.isnan(meter.rows()[0, COLUMNS.index("tokens")])


def test_the_memory_meter_reads_each_slots_gpu_and_resets_its_peaks_per_interval(monkeypatch):
    """memory/max_*_gib/rank{r} from each slot's own GPU (dp: one per replica); reset at every boundary, so
    evaluation's peak never shows in a training point. torch.cuda's allocator counters stand in for two GPUs."""
    gpus = (torch.device("cuda", 0), torch.device("cuda", 1))
    allocated, resets = {0: 3 * 2**30, 1: 2**30}, []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocated[device.index])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 2 * allocated[device.index])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", resets.append)
    meter = MemoryMeter(MeterSources([2, 2], CPU, cuda_devices=gpus))
    meter.reset()
    assert resets == list(gpus)
    rows = meter.rows()
    interval = Interval({name: rows[:, i] for i, name in enumerate(meter.columns)}, steps=1, seconds=1.0,
                        trained=True)
    assert MemoryMeter.summary(interval) == {
        "memory/max_allocated_gib/rank0": 3.0, "memory/max_reserved_gib/rank0": 6.0,
        "memory/max_allocated_gib/rank1": 1.0, "memory/max_reserved_gib/rank1": 2.0}


def test_the_optimizer_state_is_the_first_slots_and_data_time_is_per_step():
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # Adam's two moments (and a step count) per parameter
    meter = IntervalMeter(MeterSources([1, 1], CPU, optimizer=optimizer))
    for step in (1, 2):
        meter.add(StepRecord(step, [torch.ones(2)], data_seconds=0.003))
    summary = IntervalSummary.from_rows(meter.rows())
    moments = 2 * sum(p.numel() * 4 for p in model.parameters())
    assert summary.tags["memory/optimizer_state_mib/rank0"] == pytest.approx((moments + 2 * 4) / 2**20)
    assert summary.tags["memory/optimizer_state_mib/rank1"] == 0.0, "dp replicas hold none"
    assert summary.tags["time/data_ms"] == pytest.approx(3.0)
