"""The meter protocol (framework/telemetry/meter.py): what every registered meter must do for the loop to run it
without knowing it (docs/architecture.md, "Add a telemetry number"), and one meter's tags reaching the loggers."""
import math

import pytest
import torch

from framework.telemetry.meter import Interval, MeterSources, StepRecord
from framework.telemetry.meter_registry import METERS
from framework.telemetry.meters import COLUMNS, FRAME, IntervalMeter, IntervalSummary
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
    meter = IntervalMeter([4], CPU, [], clock)
    for step in (1, 2):
        meter.add(StepRecord(step, [torch.full((4,), 0.5)]))
    clock.seconds = 0.06  # what its start/stop spans added up to (tests/unit/test_per_gpu_metrics.py times them)
    summary = IntervalSummary.from_rows(meter.rows())
    scalars = report_scalars(IntervalReport(summary, [1.0], [None], [], 1.2), 0.1, cuda=False)
    assert scalars["time/wait_ms/rank0"] == pytest.approx(30.0)
    assert "time/busy_ms/rank0" in scalars  # the frame's: the rank's window less the wait meter's columns
    assert scalars["loss/train"] == 0.5 and "throughput/samples_per_sec" in scalars
    assert not [tag for tag in scalars if tag.startswith(("time/forward", "time/comm", "comm/", "throughput/tokens"))]
    meter.reset()
    assert clock.read() == 0.0, "the frame resets every meter, and the wait meter its clock"
    assert math.isnan(meter.rows()[0, COLUMNS.index("tokens")])
