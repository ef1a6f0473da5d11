"""nn.Sequential models under pipeline parallel, as pipeline tutorials cut them, on CPU workers with the loss of one
process at every step (1e-5, fp32, clipping and accumulation on) and the whole model's checkpoint names: LeNet, whose
features and classifier are Sequentials, cut where its blocks share out evenly (the second stage begins with a
ReLU(inplace=True), which copies its input first) and at its classifier (the first stage's classifier emptied, the
second's features); a model that is itself an nn.Sequential (support/user_code/sequential_models.py) over
ZBVZeroBubble's 4 stages; and a LeNet pipeline's checkpoint resumed by ddp. Real train.py processes, shared through
the run cache; the cuts in-process: tests/unit/test_model_parallel_checks.py."""
import pytest
import torch

from support.mesh_runs import COMMON, assert_continues, assert_same_losses, pipeline, result, resumed_from_step_4, train
from support.processes import user_code_env
from support.run_files import losses_by_step

LENET = ["model=lenet", "dataset.max_train_samples=512", "dataset.max_test_samples=64", *COMMON]
SEQUENTIAL = [*LENET, "model._target_=sequential_models.mlp"]
RUNS = {
    "lenet_pp2_1F1B": (LENET, pipeline("1F1B")),
    "lenet_pp2_GPipe_at_classifier.0": (LENET, [*pipeline("GPipe"), "strategy.split_points=[classifier.0]"]),
    "sequential_pp2_ZBVZeroBubble": (SEQUENTIAL, pipeline("ZBVZeroBubble")),
}


@pytest.fixture(scope="module")
def singles(runs):
    found = {}
    for model in (LENET, SEQUENTIAL):
        run_dir = train(runs, [*model, "strategy=single"], env=user_code_env())
        found[tuple(model)] = {"losses": losses_by_step(run_dir), "result": result(run_dir)}
    return found


@pytest.mark.parametrize("name", list(RUNS))
def test_a_sequential_pipeline_has_the_loss_of_one_process_at_every_step(runs, singles, name):
    model, mesh = RUNS[name]
    single = singles[tuple(model)]
    run_dir = train(runs, [*model, *mesh], env=user_code_env())
    assert_same_losses(single["losses"], run_dir)
    done = result(run_dir)
    assert done["processes"] == 2 and done["test_loss"] == pytest.approx(single["result"]["test_loss"], rel=1e-5)
    saved = torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]
    reference = torch.load(_single_dir(runs, model) / "weights" / "last.pt", weights_only=True)["model"]
    assert list(saved) == list(reference), "the whole model's names, in its order"
    for key, value in reference.items():
        torch.testing.assert_close(saved[key], value, rtol=1e-4, atol=1e-6, msg=key)


def _single_dir(runs, model):
    return train(runs, [*model, "strategy=single"], env=user_code_env())


def test_a_lenet_pipeline_checkpoint_resumes_under_ddp(runs, singles):
    """The stages' DCP shards under LeNet's own names (features.3.weight on the first stage, classifier.0.weight on
    the second), read whole by ddp's two workers."""
    pp = train(runs, [*LENET, *pipeline("1F1B")], env=user_code_env())
    run_dir, _ = resumed_from_step_4(runs, pp, [*LENET, "strategy=ddp", "strategy.nproc_per_node=2"],
                                     env=user_code_env())
    assert_continues(singles[tuple(LENET)]["losses"], run_dir)
