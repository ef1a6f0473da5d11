"""Experiments that are not single-label image classification, each from a user's own package and config dir
(examples/my_project: mypkg/tasks.py, conf/experiment/task_*.yaml) and trained as real train.py runs with single and
ddp (2 gloo workers): float targets, token sequences, masks, a dict of inputs, multi-hot targets. Also: one dataset
split by val_fraction, torchmetrics synchronized over ranks, early stopping, the best checkpoint and weights,
eval.py, load_model, the char_lm preset, a torchvision model by _target_."""
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY, check_ok, driver_says, pin_accelerator, read_scalars, run_dirs, run_train
from framework.config.targets import TargetAllowlist, allowing

EXAMPLE = REPO / "examples" / "my_project"
FAST = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=adam",
        "optimizer.lr=0.01", "lr_schedule=constant"]
# task -> (a test metric in result.json, whether larger is better)
TASKS = {"regression": ("mse", False), "char_lm": ("perplexity", False), "segmentation": ("acc", True),
         "two_inputs": ("acc", True), "multi_label": ("f1", True)}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("project") / "my_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _run(project, cwd, args, timeout=240, launcher=None):
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return run_train(["--config-dir", str(project / "conf"), *args], cwd, env=env, timeout=timeout,
                     launcher=launcher)


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("ddp", 2)])
@pytest.mark.parametrize("task", list(TASKS))
def test_a_task_beyond_image_classification_trains(project, tmp_path, task, strategy, ranks):
    check_ok(_run(project, tmp_path, [f"experiment=task_{task}", f"strategy={strategy}", *FAST]))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    metric, _ = TASKS[task]
    assert result["processes"] == ranks and math.isfinite(result[f"test_{metric}"])
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        assert f"loss/train/rank{r}" in scalars and f"throughput/samples_per_sec/rank{r}" in scalars
    losses = [v for _, v in scalars["loss/train"]]
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    assert f"{metric}/val" in scalars


def test_one_dataset_is_split_by_val_fraction_the_same_way_everywhere(project, tmp_path, monkeypatch):
    from framework.config.dataset import DatasetConfig
    from framework.config.typed import typed
    from framework.data.build import build_splits

    monkeypatch.syspath_prepend(str(project))
    options = typed(DatasetConfig, {"_target_": "mypkg.data.Blobs", "size": 512, "val_fraction": 0.25}, "dataset",
                    open_keys=True)
    with allowing(TargetAllowlist(("mypkg.*",))):  # outside a command, only the built-in targets are allowed
        first, again = build_splits(options), build_splits(options)
    assert len(first["test"]) == 128 and len(first["train"]) == 384
    assert first["train"].indices == again["train"].indices  # a pure function of the seed and the length
    assert not set(first["train"].indices) & set(first["test"].indices)
    out = check_ok(_run(project, tmp_path, ["dataset=blobs_one", "model=mlp", "strategy=ddp", *FAST]))
    assert "training MLP on Blobs" in out
    [run_dir] = run_dirs(tmp_path)
    assert json.loads((run_dir / "result.json").read_text())["test_acc"] > 0.8


@pytest.mark.parametrize("strategy", ["ddp", "horovod"])
def test_torchmetrics_on_two_ranks_equal_the_metric_over_the_whole_split_in_one_process(project, tmp_path, strategy):
    """ddp: torchmetrics' own sync over torch.distributed; horovod (no torch.distributed group): the object gather."""
    from torchmetrics import MeanSquaredError

    from framework.results.trained_model import load_model

    if strategy == "horovod":
        pytest.importorskip("horovod.torch")
    check_ok(_run(project, tmp_path / strategy, ["experiment=task_regression", f"strategy={strategy}", *FAST]))
    [run_dir] = run_dirs(tmp_path / strategy)
    result = json.loads((run_dir / "result.json").read_text())
    sys.path.insert(0, str(project))
    try:
        from mypkg.tasks import Waves

        model, test = load_model(run_dir, which="last", allowed_targets=["mypkg.*"]), Waves(train=False, size=256)
        with torch.no_grad():
            whole = MeanSquaredError()(model(test.x), test.y).item()
    finally:
        sys.path.remove(str(project))
    assert result["test_mse"] == pytest.approx(whole, rel=1e-5)
    assert result["test_mse"] == pytest.approx(result["test_loss"], rel=1e-5)  # the loss is the per-sample MSE


def test_early_stopping_ends_every_rank_at_the_same_step(project, tmp_path):
    """An lr too small to move anything: the objective does not improve, and with patience 1 the second evaluation
    ends the run (5 epochs planned); both ranks stop there and the run reports it."""
    out = check_ok(_run(project, tmp_path, ["dataset=blobs", "model=mlp", "strategy=ddp", "callbacks=early_stopping",
                                            "callbacks.early_stopping.patience=1", *FAST, "trainer.epochs=5",
                                            "optimizer.lr=1e-12"]))
    assert "early stopping: acc has not improved" in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["epochs"] == 2 and result["steps"] == 2 * 16  # 512 samples / 32 per step
    assert [s for s, _ in read_scalars(run_dir)["acc/val"]] == [16, 32]


def test_best_checkpoint_weights_and_eval_py_with_single_and_ddp(project, tmp_path):
    check_ok(_run(project, tmp_path / "train", ["dataset=blobs", "model=mlp", "strategy=ddp", *FAST]))
    [run_dir] = run_dirs(tmp_path / "train")
    result = json.loads((run_dir / "result.json").read_text())
    accuracies = dict(read_scalars(run_dir)["acc/val"])
    best_step = max(accuracies, key=lambda s: (accuracies[s], -s))  # the first evaluation with the best value
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == f"step-{best_step:08d}.json"
    weights = torch.load(run_dir / "weights" / "best.pt", weights_only=True)
    assert weights["step"] == best_step and weights["objective"]["value"] == pytest.approx(accuracies[best_step])
    assert (run_dir / "weights" / "last.pt").is_file()
    for strategy in ("single", "ddp"):
        out = check_ok(_eval(project, tmp_path / f"eval_{strategy}",
                             [f"ckpt_path={run_dir / 'weights' / 'last.pt'}", f"strategy={strategy}",
                              "allowed_targets=[mypkg.*]"]))  # the run folder names mypkg's classes
        [report] = (tmp_path / f"eval_{strategy}" / "outputs").rglob("eval.json")
        evaluated = json.loads(report.read_text())
        assert evaluated["test_acc"] == pytest.approx(result["test_acc"], abs=1e-6), out
        assert evaluated["processes"] == (2 if strategy == "ddp" else 1)


def _eval(project, cwd, args):
    """eval.py as a real process, with the project's package and config dir."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, str(REPO / "eval.py"), "--config-dir", str(project / "conf"),
                           *pin_accelerator(args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_a_torchvision_model_that_cannot_take_the_input_is_refused_with_one_line(tmp_path):
    line = driver_says(["model._target_=torchvision.models.mobilenet_v3_small", *TINY], tmp_path)
    assert line.startswith("model=torchvision.models.mobilenet_v3_small cannot take the dataset's batches (input: "
                           "float32 [2, 1, 28, 28]; target: int64 [2]): RuntimeError: "), line
    proc = run_train(["model._target_=torchvision.models.mobilenet_v3_small", *TINY], tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "training " not in proc.stdout
    assert "error: model=torchvision.models.mobilenet_v3_small cannot take" in proc.stderr


def test_a_torchvision_model_trains_by_target_with_its_own_num_classes(tmp_path):
    check_ok(run_train(["model._target_=torchvision.models.mobilenet_v3_small", "+model.num_classes=4",
                        "dataset=synthetic", "dataset.shape=[3,32,32]", "dataset.num_classes=4",
                        "dataset.train_size=64", "dataset.test_size=32", "trainer.batch_size=16",
                        "trainer.max_steps=2", "trainer.channels_last=false"], tmp_path))
