"""Users' own data shapes in this process (examples/my_project): one Dataset taking `train` for both splits, a
collate_fn per split, per-token losses and accuracy that leave the padding out, tokens metered per slot, and bad data
refused in the driver. Real runs: tests/runs/test_user_data.py."""
import shutil

import pytest
import torch

from framework.config.targets import TargetAllowlist, allowing
from support.driver import driver_says
from support.processes import REPO

EXAMPLE = REPO / "examples" / "my_project"
FAST = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=adam",
        "optimizer.lr=0.01", "lr_schedule=constant"]
BAD_PIECES = '''
import torch

from mypkg.data import Blobs


def not_a_function():
    return 3


class BrokenCollate:
    def __call__(self, samples):
        tokens, tags = zip(*samples)
        return torch.stack(tokens), torch.stack(tags)  # no padding: sequences of different lengths cannot stack


def unsplit(size: int = 64):
    return Blobs(True, size)
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_project") / "my_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "mypkg" / "bad.py").write_text(BAD_PIECES)
    return root


def test_one_dataset_target_taking_train_builds_both_splits(project, tmp_path, monkeypatch):
    from framework.config.dataset import DatasetConfig
    from framework.config.typed import typed
    from framework.data.build import build_splits

    monkeypatch.syspath_prepend(str(project))
    options = typed(DatasetConfig, {"_target_": "mypkg.data.Blobs", "size": 384}, "dataset", open_keys=True)
    with allowing(TargetAllowlist(("mypkg.*",))):  # outside a command, only the built-in targets are allowed
        splits = build_splits(options)
    assert len(splits["train"]) == len(splits["test"]) == 384
    assert not torch.equal(splits["train"].x, splits["test"].x)  # Blobs(train=True) and Blobs(train=False)
    assert torch.equal(splits["test"].x, type(splits["test"])(train=False, size=384).x)
    args = ["strategy=ddp", "model=mlp", "dataset=blobs_by_train", *FAST]
    assert driver_says(args, tmp_path, config_dir=project / "conf") == ""


def test_a_collate_fn_per_split_goes_over_the_shared_one(project, tmp_path, monkeypatch):
    from framework.config.dataset import DatasetConfig
    from framework.config.typed import typed
    from framework.data.build import build_data

    monkeypatch.syspath_prepend(str(project))
    pad = {"_target_": "mypkg.tagging.PadTags"}
    options = typed(DatasetConfig, {
        "train": {"_target_": "mypkg.tagging.Tagging", "collate_fn": {**pad, "pad_token": 31}},
        "test": {"_target_": "mypkg.tagging.Tagging", "train": False, "size": 64}, "collate_fn": pad}, "dataset")
    with allowing(TargetAllowlist(("mypkg.*",))):  # outside a command, only the built-in targets are allowed
        data = build_data(options)
    assert data.collate["train"].fn.pad_token == 31 and data.collate["test"].fn.pad_token == 0
    assert data.in_shape is None and data.pairs and data.example[0].shape[0] == 1
    args = ["strategy=ddp", "experiment=task_tagging", "~dataset.collate_fn",
            "+dataset.train.collate_fn._target_=mypkg.tagging.PadTags",
            "+dataset.test.collate_fn._target_=mypkg.tagging.PadTags", *FAST]
    assert driver_says(args, tmp_path, config_dir=project / "conf") == ""


def test_positions_the_loss_ignores_leave_each_samples_mean_and_the_accuracy():
    from torch import nn

    from framework.training.losses import BitsPerToken, SequenceCrossEntropy
    from framework.training.metrics import Accuracy
    from framework.training.step import Supervised

    logits = torch.randn(2, 3, 4)  # [B, C, T]
    tags = torch.tensor([[0, 1, -100, -100], [2, 2, 1, 0]])
    out = Supervised()(nn.Identity(), (logits, tags), nn.CrossEntropyLoss(reduction="none"))
    first = nn.functional.cross_entropy(logits[0, :, :2].T, tags[0, :2])  # its two real tokens only
    assert out.loss.shape == (2,) and out.loss[0].item() == pytest.approx(first.item(), rel=1e-6)
    assert out.tokens is None
    counted = Supervised(count_tokens=True)(nn.Identity(), (logits, tags), nn.CrossEntropyLoss(reduction="none"))
    assert int(counted.tokens) == 6  # the tags the loss scores
    right = logits.argmax(1) == tags
    expected = right[0, :2].float().mean() + right[1].float().mean()
    assert Accuracy()(logits, tags).item() == pytest.approx(expected.item())
    assert Accuracy(ignore_index=None)(logits, tags).item() == pytest.approx(right.float().mean(1).sum().item())
    by_token = logits.transpose(1, 2)  # [B, T, V], as a language model gives them
    assert SequenceCrossEntropy()(by_token, tags).shape == (2, 4)
    bits = BitsPerToken()(by_token, tags).item()
    assert bits == pytest.approx((out.loss.sum() / torch.log(torch.tensor(2.0))).item(), rel=1e-6)


BAD = {
    "collate_not_callable": (["experiment=task_tagging", "dataset.collate_fn._target_=mypkg.bad.not_a_function"],
                             "dataset.collate_fn._target_=mypkg.bad.not_a_function is not allowed: it built a int, "
                             "which cannot be called as collate_fn(samples)"),
    "collate_fails": (["experiment=task_tagging", "dataset.collate_fn._target_=mypkg.bad.BrokenCollate"],
                      "dataset.collate_fn._target_=mypkg.bad.BrokenCollate failed on the first batch "
                      "(dataset.train[0:2]): RuntimeError: stack expects each tensor to be equal size"),
    "variable_length_without_collate": (["experiment=task_tagging", "dataset.collate_fn=null"],
                                        "dataset samples differ in shape (dataset.train[0]: "),
    "inputs_only_with_supervised_step": (["experiment=task_autoencoder", "step=supervised"],
                                         "dataset.train[0] is a Tensor, not an (input, target) pair; "
                                         "step=framework.training.step.Supervised needs (inputs, targets): for "
                                         "inputs only"),
    "one_dataset_neither_split": (["model=mlp", "dataset=blobs_by_train", "dataset._target_=mypkg.bad.unsplit"],
                                  "dataset._target_=mypkg.bad.unsplit needs dataset.val_fraction (the share of its "
                                  "samples held out for testing, e.g. 0.1), or a constructor taking `train`"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_data_is_refused_in_the_driver_with_one_line(project, tmp_path, monkeypatch, name):
    args, message = BAD[name]
    monkeypatch.syspath_prepend(str(project))
    line = driver_says(["strategy=ddp", *FAST, *args], tmp_path, config_dir=project / "conf")
    assert message in line, line


def test_tokens_are_metered_on_the_device_and_shared_over_a_processs_slots_by_their_size():
    """dp's replicas are one process's slots: a micro-batch's tokens (a device tensor: no sync) go to each slot by its
    share of the batch; a step that counts none leaves the column NaN and no tokens/s tag."""
    from framework.telemetry.meter import MeterSources, StepRecord
    from framework.telemetry.meters import COLUMNS, IntervalMeter, IntervalSummary

    meter, tokens = IntervalMeter(MeterSources([3, 1], torch.device("cpu"))), COLUMNS.index("tokens")
    meter.add(StepRecord(1, [torch.ones(4)], [None]))
    assert not any(tag.startswith("throughput/tokens") for tag in IntervalSummary.from_rows(meter.rows()).tags)
    assert meter.rows()[:, tokens].isnan().all()
    meter.add(StepRecord(2, [torch.ones(4), torch.ones(4)], [torch.tensor(8), 4]))
    rows = meter.rows()
    assert rows[:, tokens].tolist() == [9.0, 3.0]
    tags = IntervalSummary.from_rows(rows).tags
    seconds = float(rows[0, COLUMNS.index("seconds")])
    assert tags["throughput/tokens_per_sec"] * seconds == pytest.approx(12)
    assert [tags[f"throughput/tokens_per_sec/rank{r}"] * seconds for r in (0, 1)] == pytest.approx([9, 3])


def test_the_example_hf_experiment_passes_the_driver(project, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    pytest.importorskip("transformers", reason="the hf extra")
    pytest.importorskip("datasets", reason="the hf extra")
    assert driver_says(["experiment=hf_text_classifier", "strategy=ddp"], tmp_path, config_dir=project / "conf") == ""
