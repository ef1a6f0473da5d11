"""lr_schedule's factor curve, in this process. The lr a real run applies: tests/runs/test_lr_schedule.py."""
import math

import pytest

from framework.config.optimizer import LrScheduleConfig
from framework.training.lr_schedule import LrSchedule

WARMUP_COSINE = LrScheduleConfig(name="warmup_cosine", warmup_fraction=0.1, start_factor=0.1, final_factor=0.0)


def test_warmup_cosine_rises_linearly_then_decays_to_the_final_factor():
    schedule = LrSchedule(WARMUP_COSINE, total_steps=100)
    factors = [schedule.factor(step) for step in range(1, 101)]
    assert factors[0] == pytest.approx(0.1)
    assert factors[5] == pytest.approx(0.1 + 0.9 * 5 / 10)  # step 6: half-way through the 10 warm-up steps
    assert factors[10] == pytest.approx(1.0)  # step 11: the peak
    assert all(a < b for a, b in zip(factors[:10], factors[1:11]))
    assert all(a > b for a, b in zip(factors[10:], factors[11:]))
    assert factors[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 89 / 90)))  # just above final_factor 0


def test_constant_is_one_everywhere():
    schedule = LrSchedule(LrScheduleConfig(name="constant"), total_steps=10)
    assert {schedule.factor(step) for step in range(1, 11)} == {1.0}
