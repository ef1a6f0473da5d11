"""lr_schedule: the lr a real run applies (TensorBoard's `lr` tag). The factor curve itself, in-process:
tests/unit/test_lr_schedule.py."""
import math

import pytest

from support.processes import TINY
from support.run_files import read_scalars


@pytest.mark.parametrize("schedule", ["warmup_cosine", "constant"])
def test_a_run_applies_the_schedule_to_the_optimizer(runs, schedule):
    """TINY: 2048 samples, batch 64, 2 epochs = 64 steps, logged every 4 steps. warmup_cosine is the default schedule:
    the single process's TINY run (tests/runs/test_end_to_end.py), with the default optimizer's lr."""
    if schedule == "warmup_cosine":
        run, lr = runs.train(["strategy=single", *TINY]).ok(), 0.2  # optimizer=sgd_nesterov's lr
    else:
        run, lr = runs.train(["strategy=single", "lr_schedule=constant", "optimizer=sgd", "optimizer.lr=0.05",
                              *TINY]).ok(), 0.05
    logged = dict(read_scalars(run.run_dir)["lr"])
    assert sorted(logged)[:2] == [4, 8] and max(logged) == 64
    if schedule == "constant":
        assert list(logged.values()) == pytest.approx([lr] * len(logged))
        return
    # step s trains with lr x factor(s): warm-up over the first 6.4 steps, cosine to 0 at step 64
    assert logged[4] == pytest.approx(lr * (0.1 + 0.9 * (3 / 64) / 0.1), rel=1e-5)
    assert logged[8] == pytest.approx(lr * 0.5 * (1 + math.cos(math.pi * (7 / 64 - 0.1) / 0.9)), rel=1e-5)
    later = [logged[s] for s in sorted(logged) if s >= 8]
    assert all(a > b for a, b in zip(later, later[1:])) and logged[64] < 0.001 * lr / 0.05
