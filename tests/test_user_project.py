"""A user's own experiment from outside this repository: their package (a Dataset, a model, a loss), their config
dir (`--config-dir`), selected on the command line like the built-ins. Real train.py processes."""
import json
import os
import shutil
import textwrap

import numpy as np
import pytest

from conftest import REPO, check_ok, driver_says, losses_by_step, read_scalars, run_dirs, run_train, torchrun

EXAMPLE = REPO / "examples" / "my_project"  # docs/your-own-code.md, "Your own model and data", shows
# Extra pieces for the bad-input cases, added to a copy of the example.
BAD_PIECES = '''
from mypkg.data import Blobs


class Ragged(Blobs):
    def __getitem__(self, i):
        return self.x[i][: 8 - (i % 2)], int(self.y[i])


def not_a_dataset(train: bool = True):
    return (i for i in range(3))


def no_pairs(train: bool = True):
    return [1, 2, 3]
'''
COMMON = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=sgd",
          "optimizer.lr=0.05", "lr_schedule=constant", "model=mlp"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("projects") / "my_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "mypkg" / "bad.py").write_text(BAD_PIECES)
    return root


def _run(project, cwd, args, timeout=240, launcher=None):
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return run_train(["--config-dir", str(project / "conf"), *args], cwd, env=env, timeout=timeout, launcher=launcher)


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("ddp", 2), ("dp", 1), ("deepspeed", 2), ("horovod", 2)])
def test_own_dataset_and_model_train_from_their_own_package_and_config_dir(project, tmp_path, strategy, ranks):
    if strategy in ("deepspeed", "horovod"):
        pytest.importorskip({"deepspeed": "deepspeed", "horovod": "horovod.torch"}[strategy])
    out = check_ok(_run(project, tmp_path, [f"strategy={strategy}", "dataset=blobs", *COMMON]))
    assert "training MLP on Blobs" in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == ranks and result["test_acc"] > 0.9  # three well separated blobs
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        assert f"throughput/samples_per_sec/rank{r}" in scalars and f"loss/train/rank{r}" in scalars
    losses = [v for _, v in scalars["loss/train"]]
    assert losses[-1] < losses[0] * 0.5


def test_own_strategy_under_torchrun(project, tmp_path):
    """The other ranks never run Hydra, but compose the config to join: from the user's --config-dir too, where
    their own strategy lives."""
    out = check_ok(_run(project, tmp_path, ["strategy=announcing_ddp", "strategy.banner=hi", "dataset=blobs",
                                            *COMMON], launcher=torchrun()))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "announcing_ddp" and result["processes"] == 2 and result["test_acc"] > 0.9


def test_own_strategy_from_their_package_trains_with_two_gloo_workers(project, tmp_path):
    """conf/strategy/announcing_ddp.yaml in the user's config dir names mypkg's DDPStrategy subclass; the elastic
    agent's workers import it from the user's package, and its name is the run's strategy name."""
    out = check_ok(_run(project, tmp_path, ["strategy=announcing_ddp", "strategy.banner=hi there", "dataset=blobs",
                                            "trainer.log_all_ranks=true", *COMMON]))
    assert "rank 0/2 joined: hi there" in out and "rank 1/2 joined: hi there" in out
    [run_dir] = run_dirs(tmp_path)
    assert "announcing_ddp" in run_dir.name
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "announcing_ddp" and result["processes"] == 2 and result["test_acc"] > 0.9


def test_own_callbacks_from_their_package_watch_and_stop_a_two_worker_run(project, tmp_path):
    """conf/callbacks/with_history.yaml in the user's config dir adds mypkg's Callback to the built-in ones; it
    gets every log interval and evaluation on rank 0 and writes its file there. StopAtTarget (the example of
    docs/loop-features.md, "Writing a callback") ends both ranks after the second epoch's evaluation: rank 0 decides
    on its result, every rank hears it through the state's broadcast."""
    proc = check_ok(_run(project, tmp_path, ["strategy=ddp", "dataset=blobs", "callbacks=with_history", *COMMON,
                                             "+callbacks.stop._target_=mypkg.callbacks.StopAtTarget",
                                             "+callbacks.stop.target=0.0", "trainer.eval_every_n_epochs=2"]))
    [run_dir] = run_dirs(tmp_path)
    rows = (run_dir / "loss_history.csv").read_text().splitlines()
    assert rows[0] == "step,kind,loss,samples_per_sec"
    kinds = [row.split(",")[1] for row in rows[1:]]
    assert kinds.count("test") == 1 and kinds.count("train") == 8  # 16 steps a epoch / 4 per log, 2 of 3 epochs
    assert "stopped after epoch 2, step 32: acc reached 0 at step 32" in proc, proc
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["epochs"], result["steps"]) == (2, 32)
    assert "throughput/samples_per_sec" in read_scalars(run_dir), "the built-in callbacks still run"


def test_a_callback_that_is_not_a_callback_is_refused_in_the_driver(project, tmp_path):
    proc = _run(project, tmp_path, ["strategy=ddp", "dataset=blobs", *COMMON,
                                    "+callbacks.bad._target_=mypkg.models.MLP", "+callbacks.bad.in_shape=[8]",
                                    "+callbacks.bad.num_classes=3"], timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert ("callbacks.bad._target_=mypkg.models.MLP is not allowed: it built a MLP, not a "
            "framework.callbacks.base.Callback") in proc.stderr, proc.stderr


def test_under_torchrun_the_refusal_lists_the_strategies_of_every_config_dir(project, tmp_path):
    """Which strategies fit workers that torchrun started comes from each strategy class (outer_kinds),
    the user's own included, not from a list of names."""
    proc = _run(project, tmp_path, ["strategy=dp", "dataset=blobs", *COMMON], timeout=120,
                launcher=torchrun(1))
    assert proc.returncode != 0
    assert "strategy=dp is not allowed under torchrun" in proc.stderr, proc.stderr
    fits = "use strategy=announcing_ddp, ddp, deepspeed, fsdp, pp, tp, tp_function, tp_plan or auto"
    assert fits in proc.stderr, proc.stderr


def test_dataloader_and_in_memory_paths_give_the_same_losses_for_a_dataset_built_by_a_function(project, tmp_path):
    args = ["strategy=ddp", "dataset=blobs_tensors", *COMMON, "trainer.epochs=1", "trainer.log_every_n_steps=1"]
    check_ok(_run(project, tmp_path / "fast", args))
    check_ok(_run(project, tmp_path / "slow", [*args, "dataset.in_memory=false", "trainer.num_workers=1"]))
    [fast], [slow] = run_dirs(tmp_path / "fast"), run_dirs(tmp_path / "slow")
    a, b = losses_by_step(fast), losses_by_step(slow)
    assert sorted(a) == sorted(b) and len(a) == 16
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6), f"step {step}"


def test_loss_metrics_and_objective_are_components(project, tmp_path):
    out = check_ok(_run(project, tmp_path, ["strategy=single", "dataset=blobs", *COMMON, "trainer.epochs=1",
                                            "loss=focal", "metrics=top5", "metrics.top5_acc.top_k=2",
                                            "+dataset.train._partial_=true",  # a factory the framework calls
                                            "trainer.objective=loss"]))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["metrics"] == ["acc", "top5_acc"] and result["test_top5_acc"] >= result["test_acc"]
    assert result["objective"] == "loss"
    scalars = read_scalars(run_dir)
    assert "acc/val" in scalars and "top5_acc/val" in scalars and "hparam/test_top5_acc" in scalars
    assert "test top5_acc" in out


def _png_folder(root, classes=2, per_class=12, size=16):
    from PIL import Image

    g = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            base = 200 if c else 40  # a bright class and a dark one: learnable
            pixels = np.clip(base + g.normal(0, 20, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")


def test_image_folder_with_a_torchvision_transform_pipeline(project, tmp_path):
    _png_folder(tmp_path / "images")
    split = """
          _target_: torchvision.datasets.ImageFolder
          root: {root}
          transform:
            _target_: torchvision.transforms.Compose
            transforms:
              - _target_: torchvision.transforms.Grayscale
              - _target_: torchvision.transforms.ToTensor
    """
    (project / "conf" / "dataset" / "pngs.yaml").write_text(
        "train:" + textwrap.indent(textwrap.dedent(split.format(root=tmp_path / "images")), "  ")
        + "test:" + textwrap.indent(textwrap.dedent(split.format(root=tmp_path / "images")), "  "))
    out = check_ok(_run(project, tmp_path / "run", [
        "strategy=ddp", "dataset=pngs", "model=simple_cnn", "trainer.batch_size=8", "trainer.epochs=2",
        "trainer.log_every_n_steps=1", "optimizer=sgd", "optimizer.lr=0.05", "lr_schedule=constant"]))
    assert "training SimpleCNN on ImageFolder" in out
    [run_dir] = run_dirs(tmp_path / "run")
    result = json.loads((run_dir / "result.json").read_text())
    # 24 images, 12 per rank, micro-batches of 4: 3 steps per epoch; 2 classes found from the folders
    assert result["processes"] == 2 and result["steps"] == 6 and result["test_acc"] >= 0.5


BAD = {
    "not_importable": (["dataset=blobs", "dataset.train._target_=mypkg.data.NoSuchThing"],
                       "dataset.train._target_=mypkg.data.NoSuchThing is not allowed: it cannot be imported"),
    "not_a_dataset": (["dataset=blobs", "dataset.train._target_=mypkg.bad.not_a_dataset"],
                      "dataset.train._target_=mypkg.bad.not_a_dataset is not allowed: it returned a generator, which is neither a "
                      "map-style torch Dataset (__len__ and __getitem__ giving (input, target)) nor an IterableDataset"),
    "items_not_pairs": (["dataset=blobs", "dataset.train._target_=mypkg.bad.no_pairs"],
                        "dataset.train[0] is an int, not an (input, target) pair"),
    "labels_out_of_range": (["dataset=blobs", "+dataset.num_classes=3", "+dataset.train.label_offset=1"],
                            "dataset.train has label 3, outside [0, 3) for num_classes=3"),
    "ragged_samples": (["dataset=blobs", "dataset.train._target_=mypkg.bad.Ragged"],
                       "dataset samples differ in shape (dataset.train[0]: [8], dataset.train[1]: [7]"),
    "model_cannot_take_input": (["dataset=blobs", "model=lenet"],
                                "model=lenet needs image input (channels, height, width); the dataset gives shape (8,)"),
    "bad_constructor_argument": (["dataset=blobs", "+dataset.train.colour=red"],
                                 "dataset.train._target_=mypkg.data.Blobs failed to build: TypeError"),
    "unknown_objective": (["dataset=blobs", "trainer.objective=f1"],
                          "trainer.objective='f1' is not allowed: expected loss or a metric of this run (acc)"),
    "top_k_above_classes": (["dataset=blobs", "metrics=top5"],
                            "metrics.top5_acc.top_k=5 is not allowed: the dataset has 3 classes"),
    "augment_flat_input": (["dataset=blobs", "+dataset.augment={_target_: framework.data.augment.RandomCropFlip}"],
                           "dataset.augment is not allowed for inputs of shape [8]"),
    "strategy_not_importable": (["dataset=blobs", "strategy._target_=mypkg.strategies.NoSuchStrategy"],
                                "strategy._target_=mypkg.strategies.NoSuchStrategy is not allowed: it cannot be imported"),
    "strategy_not_a_strategy": (["dataset=blobs", "strategy._target_=mypkg.models.MLP"],
                                "strategy._target_=mypkg.models.MLP is not allowed: it is not a subclass of "
                                "framework.strategies.base.Strategy"),
    "own_strategy_option": (["dataset=blobs", "strategy=announcing_ddp", "strategy.banner=' '"],
                            "strategy.banner=' ' is not allowed: expected a non-empty string"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_user_components_fail_in_the_driver_with_one_clear_message(project, tmp_path, monkeypatch, name):
    """In this process (conftest.driver_says), with the project's package importable as a run has it."""
    args, message = BAD[name]
    monkeypatch.syspath_prepend(str(project))
    line = driver_says(["strategy=ddp", *COMMON, *args], tmp_path, config_dir=project / "conf")
    assert message in line, line


def test_a_bad_user_component_stops_the_run_with_one_line_and_no_worker(project, tmp_path):
    proc = _run(project, tmp_path, ["strategy=ddp", *COMMON, *BAD["not_a_dataset"][0]], timeout=120)
    assert proc.returncode != 0
    assert BAD["not_a_dataset"][1] in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "training MLP" not in proc.stdout


def test_the_default_loss_is_cross_entropy_with_its_label_smoothing_option():
    import torch
    import torch.nn.functional as F
    from hydra import compose, initialize_config_dir

    from framework.training.metrics import build_loss, per_sample_losses

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=["loss.label_smoothing=0.1"])
    logits, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    expected = F.cross_entropy(logits, labels, label_smoothing=0.1, reduction="none")
    assert torch.allclose(per_sample_losses(build_loss(cfg.loss)(logits, labels), len(labels)), expected)
