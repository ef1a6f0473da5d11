"""lr_schedule: the factor curve itself, and the lr a real run applies (TensorBoard's `lr` tag)."""
import math

import pytest

from conftest import TINY, check_ok, read_scalars, run_dirs, run_train
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


@pytest.mark.parametrize("schedule", ["warmup_cosine", "constant"])
def test_a_run_applies_the_schedule_to_the_optimizer(tmp_path, schedule):
    # TINY: 2048 samples, batch 64, 2 epochs = 64 steps, logged every 4 steps
    check_ok(run_train([f"lr_schedule={schedule}", "optimizer=sgd", "optimizer.lr=0.05", *TINY], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    logged = dict(read_scalars(run_dir)["lr"])
    assert sorted(logged)[:2] == [4, 8] and max(logged) == 64
    if schedule == "constant":
        assert list(logged.values()) == pytest.approx([0.05] * len(logged))
        return
    # step s trains with 0.05 x factor(s): warm-up over the first 6.4 steps, cosine to 0 at step 64
    assert logged[4] == pytest.approx(0.05 * (0.1 + 0.9 * (3 / 64) / 0.1), rel=1e-5)
    assert logged[8] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi * (7 / 64 - 0.1) / 0.9)), rel=1e-5)
    later = [logged[s] for s in sorted(logged) if s >= 8]
    assert all(a > b for a, b in zip(later, later[1:])) and logged[64] < 0.001
