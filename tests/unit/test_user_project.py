"""A user's own experiment from outside this repository (examples/my_project), in this process: bad user components
fail in the driver with one clear message (support.driver.driver_says, the project's package importable as a run has
it), the default loss. As real runs: tests/runs/test_user_project.py."""
import logging
import shutil

import pytest

from support.driver import composed, driver_says
from support.processes import EXAMPLE

BAD_PIECES = '''
from mypkg.data import Blobs


class Ragged(Blobs):
    def __getitem__(self, i):
        return self.x[i][: 8 - (i % 2)], int(self.y[i])


def not_a_dataset(train: bool = True):
    return (i for i in range(3))


def no_pairs(train: bool = True):
    return [1, 2, 3]


from mypkg.strategies import AnnouncingDDP


class WrittenBeforeRanks(AnnouncingDDP):
    def __init__(self, options, trainer):  # a strategy written before hydra-dist handed it its ranks
        super().__init__(options, trainer, None)
'''
COMMON = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=sgd",
          "optimizer.lr=0.05", "lr_schedule=constant", "model=mlp"]




@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A copy of the example with extra pieces for the bad cases (support/bad_inputs.py's companions)."""
    root = tmp_path_factory.mktemp("projects") / "my_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "mypkg" / "bad.py").write_text(BAD_PIECES)
    return root


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
                                 "dataset.train key colour comes from the command line (+dataset.train.colour=red), "
                                 "and mypkg.data.Blobs does not take it (it takes: train, size, classes, dim, "
                                 "label_offset); drop that override"),
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
    "strategy_without_ranks": (["dataset=blobs", "strategy=announcing_ddp",
                                "strategy._target_=mypkg.bad.WrittenBeforeRanks"],
                               "strategy._target_=mypkg.bad.WrittenBeforeRanks is not allowed: its __init__ takes no "
                               "`ranks`, and a strategy is built as WrittenBeforeRanks(options, trainer, ranks=...)"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_user_components_fail_in_the_driver_with_one_clear_message(project, tmp_path, monkeypatch, name):
    """In this process (conftest.driver_says), with the project's package importable as a run has it."""
    args, message = BAD[name]
    monkeypatch.syspath_prepend(str(project))
    line = driver_says(["strategy=ddp", *COMMON, *args], tmp_path, config_dir=project / "conf")
    assert message in line, line


@pytest.mark.parametrize("name", ["not_importable", "strategy_not_importable"])
def test_a_target_that_does_not_import_is_said_in_one_line_alone(project, tmp_path, monkeypatch, caplog, name):
    """Hydra's get_object logs each failed lookup at ERROR (three lines a lookup, printed above ours): none is left;
    the line itself keeps the cause (the strategy's kept only Hydra's first line, "Error loading 'x':")."""
    args, message = BAD[name]
    monkeypatch.syspath_prepend(str(project))
    with caplog.at_level(logging.ERROR):
        line = driver_says(["strategy=ddp", *COMMON, *args], tmp_path, config_dir=project / "conf")
    assert message in line and "No module named 'mypkg." in line, line
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_callback_that_is_not_a_callback_is_refused_in_the_driver(project, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    line = driver_says(["strategy=ddp", "dataset=blobs", *COMMON, "+callbacks.bad._target_=mypkg.models.MLP",
                        "+callbacks.bad.in_shape=[8]", "+callbacks.bad.num_classes=3"], tmp_path,
                       config_dir=project / "conf")
    assert ("callbacks.bad._target_=mypkg.models.MLP is not allowed: it built a MLP, not a "
            "framework.callbacks.base.Callback") in line, line


def test_the_default_loss_is_cross_entropy_with_its_label_smoothing_option():
    import torch
    import torch.nn.functional as F

    from framework.training.metrics import build_loss, per_sample_losses

    cfg = composed("loss.label_smoothing=0.1")
    logits, labels = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 0, 1])
    expected = F.cross_entropy(logits, labels, label_smoothing=0.1, reduction="none")
    assert torch.allclose(per_sample_losses(build_loss(cfg.loss)(logits, labels), len(labels)), expected)

