"""Experiments that are not single-label image classification, each from a user's own package and config dir
(examples/my_project: mypkg/tasks.py, conf/experiment/task_*.yaml) and trained as real train.py runs with single and
ddp (2 gloo workers): float targets, token sequences, masks, a dict of inputs, multi-hot targets. Also: one dataset
split by val_fraction, torchmetrics synchronized over ranks, early stopping, the best checkpoint and weights,
eval.py, load_model, a torchvision model by _target_.

The task matrix is one sweep per strategy (`-m experiment=task_a,task_b,...`): every job is a run of its own, in
its own folder, and the jobs share one interpreter's start-up."""
import json
import math
import sys

import pytest
import torch

from framework.config.targets import TargetAllowlist, allowing
from support.processes import check_ok, run_eval
from support.run_cache import example_project
from support.run_files import read_scalars, walk

FAST = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=adam",
        "optimizer.lr=0.01", "lr_schedule=constant"]
# task -> (a test metric in result.json, whether larger is better)
TASKS = {"regression": ("mse", False), "char_lm": ("perplexity", False), "segmentation": ("acc", True),
         "two_inputs": ("acc", True), "multi_label": ("f1", True)}


@pytest.fixture(scope="module")
def project(runs):
    return example_project(runs)


def task_jobs(runs, project, strategy: str) -> dict:
    """Every task trained with `strategy`, one sweep: job folder by task."""
    sweep = runs.train(project.args("-m", f"experiment={','.join(f'task_{t}' for t in TASKS)}",
                                    f"strategy={strategy}", *FAST), env=project.env(), timeout=900).ok()
    return {job.name.split("experiment=task_", 1)[1]: job for job in sweep.jobs}


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("ddp", 2)])
@pytest.mark.parametrize("task", list(TASKS))
def test_a_task_beyond_image_classification_trains(runs, project, task, strategy, ranks):
    run_dir = task_jobs(runs, project, strategy)[task]
    assert run_dir.name.endswith(f"experiment=task_{task}"), run_dir
    result = json.loads((run_dir / "result.json").read_text())
    metric, _ = TASKS[task]
    assert result["processes"] == ranks and math.isfinite(result[f"test_{metric}"])
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        assert f"loss/train/rank{r}" in scalars and f"throughput/samples_per_sec/rank{r}" in scalars
    losses = [v for _, v in scalars["loss/train"]]
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    assert f"{metric}/val" in scalars


def test_one_dataset_is_split_by_val_fraction_the_same_way_everywhere(runs, project, monkeypatch):
    from framework.config.dataset import DatasetConfig
    from framework.config.typed import typed
    from framework.data.build import build_splits

    monkeypatch.syspath_prepend(str(project.root))
    options = typed(DatasetConfig, {"_target_": "mypkg.data.Blobs", "size": 512, "val_fraction": 0.25}, "dataset",
                    open_keys=True)
    with allowing(TargetAllowlist(("mypkg.*",))):  # outside a command, only the built-in targets are allowed
        first, again = build_splits(options), build_splits(options)
    assert len(first["test"]) == 128 and len(first["train"]) == 384
    assert first["train"].indices == again["train"].indices  # a pure function of the seed and the length
    assert not set(first["train"].indices) & set(first["test"].indices)
    run = runs.train(project.args("dataset=blobs_one", "model=mlp", "strategy=ddp", *FAST), env=project.env()).ok()
    assert "training MLP on Blobs" in run.stdout
    assert run.result()["test_acc"] > 0.8


@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_torchmetrics_on_two_ranks_equal_the_metric_over_the_whole_split_in_one_process(runs, project, strategy):
    """ddp: torchmetrics' own sync over torch.distributed (the task matrix's regression run); horovod (no
    torch.distributed group): the object gather."""
    from torchmetrics import MeanSquaredError

    from framework.results.trained_model import load_model

    if strategy == "horovod":
        pytest.importorskip("horovod.torch")
        run_dir = runs.train(project.args("experiment=task_regression", "strategy=horovod", *FAST),
                             env=project.env()).ok().run_dir
    else:
        run_dir = task_jobs(runs, project, "ddp")["regression"]
    result = json.loads((run_dir / "result.json").read_text())
    sys.path.insert(0, str(project.root))
    try:
        from mypkg.tasks import Waves

        model, test = load_model(run_dir, which="last", allowed_targets=["mypkg.*"]), Waves(train=False, size=256)
        with torch.no_grad():
            whole = MeanSquaredError()(model(test.x), test.y).item()
    finally:
        sys.path.remove(str(project.root))
    assert result["test_mse"] == pytest.approx(whole, rel=1e-5)
    assert result["test_mse"] == pytest.approx(result["test_loss"], rel=1e-5)  # the loss is the per-sample MSE


def test_early_stopping_ends_every_rank_at_the_same_step(runs, project):
    """An lr too small to move anything: the objective does not improve, and with patience 1 the second evaluation
    ends the run (5 epochs planned); both ranks stop there and the run reports it."""
    run = runs.train(project.args("dataset=blobs", "model=mlp", "strategy=ddp", "callbacks=early_stopping",
                                  "callbacks.early_stopping.patience=1", *FAST, "trainer.epochs=5",
                                  "optimizer.lr=1e-12"), env=project.env()).ok()
    assert "early stopping: acc has not improved" in run.stdout
    result = run.result()
    assert result["epochs"] == 2 and result["steps"] == 2 * 16  # 512 samples / 32 per step
    assert [s for s, _ in read_scalars(run.run_dir)["acc/val"]] == [16, 32]


def test_best_checkpoint_weights_and_eval_py_with_single_and_ddp(runs, project, tmp_path):
    run = runs.train(project.args("dataset=blobs", "model=mlp", "strategy=ddp", *FAST), env=project.env()).ok()
    run_dir, result = run.run_dir, run.result()
    accuracies = dict(read_scalars(run_dir)["acc/val"])
    best_step = max(accuracies, key=lambda s: (accuracies[s], -s))  # the first evaluation with the best value
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == f"step-{best_step:08d}.json"
    weights = torch.load(run_dir / "weights" / "best.pt", weights_only=True)
    assert weights["step"] == best_step and weights["objective"]["value"] == pytest.approx(accuracies[best_step])
    assert (run_dir / "weights" / "last.pt").is_file()
    for strategy in ("single", "ddp"):
        out = check_ok(run_eval(project.args(f"ckpt_path={run_dir / 'weights' / 'last.pt'}", f"strategy={strategy}",
                                             "allowed_targets=[mypkg.*]"),  # the run folder names mypkg's classes
                                tmp_path / f"eval_{strategy}", env=project.env()))
        [report] = walk(tmp_path / f"eval_{strategy}" / "outputs", "eval.json")
        evaluated = json.loads(report.read_text())
        assert evaluated["test_acc"] == pytest.approx(result["test_acc"], abs=1e-6), out
        assert evaluated["processes"] == (2 if strategy == "ddp" else 1)


def test_a_torchvision_model_trains_by_target_with_its_own_num_classes(runs):
    runs.train(["model._target_=torchvision.models.mobilenet_v3_small", "+model.num_classes=4", "dataset=synthetic",
                "dataset.shape=[3,32,32]", "dataset.num_classes=4", "dataset.train_size=64", "dataset.test_size=32",
                "trainer.batch_size=16", "trainer.max_steps=2", "trainer.channels_last=false"]).ok()
