"""A user's own experiment from outside this repository: their package (a Dataset, a model, a loss), their config
dir (`--config-dir`), selected on the command line like the built-ins. Real train.py processes."""
import json
import os
import textwrap

import numpy as np
import pytest

from conftest import check_ok, losses_by_step, read_scalars, run_dirs, run_train

DATA = '''
import torch
from torch.utils.data import Dataset, TensorDataset


class Blobs(Dataset):
    """Two Gaussian blobs per class in 8 dimensions; map-style, (input, label) per index."""

    def __init__(self, train: bool = True, size: int = 512, classes: int = 3, label_offset: int = 0):
        g = torch.Generator().manual_seed(0 if train else 1)
        centers = torch.randn(classes, 8, generator=torch.Generator().manual_seed(42)) * 3
        self.y = torch.randint(0, classes, (size,), generator=g)
        self.x = centers[self.y] + torch.randn(size, 8, generator=g)
        self.y = self.y + label_offset
        self.classes = [f"class{i}" for i in range(classes)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def blobs_tensors(train: bool = True, size: int = 512):
    """A dataset built by a function: the same blobs as one TensorDataset (so the in-memory path applies)."""
    b = Blobs(train, size)
    return TensorDataset(b.x, b.y)


class Ragged(Blobs):
    def __getitem__(self, i):
        return self.x[i][: 8 - (i % 2)], int(self.y[i])


def not_a_dataset(train: bool = True):
    return (i for i in range(3))


def no_pairs(train: bool = True):
    return [1, 2, 3]
'''

MODELS = '''
from torch import nn


class MyNet(nn.Module):
    def __init__(self, in_shape, num_classes, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)
'''

CONFIGS = {
    "dataset/blobs.yaml": """
        train:
          _target_: mypkg.data.Blobs
          train: true
        test:
          _target_: mypkg.data.Blobs
          train: false
          size: 256
    """,
    "dataset/blobs_tensors.yaml": """
        name: blobs_tensors
        train:
          _target_: mypkg.data.blobs_tensors
          train: true
        test:
          _target_: mypkg.data.blobs_tensors
          train: false
          size: 256
    """,
    "model/my_net.yaml": """
        _target_: mypkg.models.MyNet
        hidden: 32
    """,
}
COMMON = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=sgd",
          "optimizer.lr=0.05", "lr_schedule=constant", "model=my_net"]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("my_project")
    (root / "mypkg").mkdir()
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "mypkg" / "data.py").write_text(DATA)
    (root / "mypkg" / "models.py").write_text(MODELS)
    for name, text in CONFIGS.items():
        (root / "conf" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "conf" / name).write_text(textwrap.dedent(text))
    return root


def _run(project, cwd, args, timeout=240):
    cwd.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return run_train(["--config-dir", str(project / "conf"), *args], cwd, env=env, timeout=timeout)


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("ddp", 2)])
def test_own_dataset_and_model_train_from_their_own_package_and_config_dir(project, tmp_path, strategy, ranks):
    out = check_ok(_run(project, tmp_path, [f"strategy={strategy}", "dataset=blobs", *COMMON]))
    assert "training MyNet on Blobs" in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == ranks and result["test_acc"] > 0.9  # three well separated blobs
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        assert f"throughput/samples_per_sec/rank{r}" in scalars and f"loss/train/rank{r}" in scalars
    losses = [v for _, v in scalars["loss/train"]]
    assert losses[-1] < losses[0] * 0.5


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
                                            "loss.label_smoothing=0.1", "metrics=top5", "metrics.top5_acc.top_k=2",
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
    "not_a_dataset": (["dataset=blobs", "dataset.train._target_=mypkg.data.not_a_dataset"],
                      "dataset.train._target_=mypkg.data.not_a_dataset is not allowed: it returned a generator, not a map-style torch Dataset"),
    "items_not_pairs": (["dataset=blobs", "dataset.train._target_=mypkg.data.no_pairs"],
                        "dataset.train[0] is a int, not an (input, label) pair"),
    "labels_out_of_range": (["dataset=blobs", "+dataset.num_classes=3", "+dataset.train.label_offset=1"],
                            "dataset.train has label 3, outside [0, 3) for num_classes=3"),
    "ragged_samples": (["dataset=blobs", "dataset.train._target_=mypkg.data.Ragged"],
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
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_user_components_fail_in_the_driver_with_one_clear_message(project, tmp_path, name):
    args, message = BAD[name]
    proc = _run(project, tmp_path, ["strategy=ddp", *COMMON, *args], timeout=120)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "training MyNet" not in proc.stdout
