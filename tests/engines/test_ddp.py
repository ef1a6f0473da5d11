"""DDP is exact: 2 gloo workers and one process, same global batch and seed, fp32, give the same losses.

Each rank takes rank::2 of the same epoch permutation, so the two micro-batches of a step are exactly the single
process's batch, and DDP averages the gradients. The only difference left is summation order (about 1e-7 relative,
measured), well inside the 1e-5 bound. Adam here (support/references.py: ADAM); SGD with accumulation, clipping and
the other features: tests/engines/test_rich_runs.py. Real train.py runs, shared through the run cache; a run killed
and resumed in its folder continues the shared run's curve (`make test` runs it: its only resume)."""
import json

import pytest

from support.processes import assert_killed_run_resumes
from support.references import ADAM, STEPS, adam
from support.run_files import assert_curves_match, read_scalars


def curve(run) -> list[tuple[int, float]]:
    return read_scalars(run.ok().run_dir)["loss/train"]


@pytest.mark.core
def test_ddp_two_workers_match_one_process_at_every_step(runs):
    single, ddp = curve(runs.train(adam("single"))), curve(runs.train(adam("ddp")))
    assert [s for s, _ in single] == [s for s, _ in ddp] == list(range(1, STEPS + 1))
    assert_curves_match(single, ddp, 1e-5, ("single", "ddp"))
    assert single[-1][1] < single[0][1]


@pytest.mark.core
def test_a_killed_run_resumes_in_its_folder_with_the_uninterrupted_losses(runs, tmp_path):
    """A run of its own (killed, then run again in its folder): rank 1 is SIGKILLed after step 6, so the run fails;
    the same command resumes from the step-4 checkpoint and logs the shared uninterrupted run's loss at every step."""
    uninterrupted = runs.train(adam("ddp")).ok().run_dir
    run_dir = assert_killed_run_resumes(tmp_path, adam("ddp"), "kill_after_step:6:1", uninterrupted, STEPS,
                                        resumed_from=4)
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["resumed_from_step"], result["steps"], result["processes"]) == (4, STEPS, 2)


def test_in_memory_input_path_matches_the_dataloader_path(runs):
    """The fast path (whole split on the device, index gather) trains exactly like DataLoader + DistributedSampler."""
    fast = curve(runs.train(adam("ddp")))  # dataset.in_memory=true is the default
    loader = curve(runs.train([*adam("ddp"), "dataset.in_memory=false", "trainer.num_workers=0"]))
    assert fast == loader


def test_losses_kept_on_the_device_between_log_boundaries_average_the_logged_steps(runs):
    """The loop never reads the loss per step: it sums on the device and reads once per log interval. The interval
    means of a run logged every 4 steps equal the means of the same run's per-step losses."""
    every_step = dict(curve(runs.train(adam("single"))))
    every_four = curve(runs.train(["strategy=single", *ADAM, "trainer.log_every_n_steps=4"]))
    assert [s for s, _ in every_four] == [4, 8, 12]
    for step, mean in every_four:
        expected = sum(every_step[s] for s in range(step - 3, step + 1)) / 4
        assert mean == pytest.approx(expected, rel=1e-6), f"steps {step - 3}-{step}"
