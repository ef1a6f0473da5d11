"""Users' own data shapes (examples/my_project): variable-length samples padded by the user's collate_fn, samples
that are inputs only with a step of the user's own, a model whose num_classes defaults to None, one Dataset taking
`train` for both splits, and per-token losses and accuracy that leave the padding out. Real train.py and eval.py
processes where the behaviour is a run, in-process checks where it is not."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import REPO, check_ok, driver_says, pin_accelerator, read_scalars, run_dirs, run_train
from framework.config.targets import TargetAllowlist, allowing

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


def _env(project) -> dict:
    return {"PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _run(project, cwd, args, timeout=240):
    cwd.mkdir(parents=True, exist_ok=True)
    return run_train(["--config-dir", str(project / "conf"), *args], cwd, env=_env(project), timeout=timeout)


def _trained(project, cwd, args) -> tuple:
    """(run folder, result.json, loss/train values) of one run that must succeed."""
    check_ok(_run(project, cwd, args))
    [run_dir] = run_dirs(cwd)
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    return run_dir, json.loads((run_dir / "result.json").read_text()), losses


def _token_accuracy_per_sample(model, dataset) -> float:
    """The metric by hand: each test sequence's share of tokens tagged right (no padding: one sample at a time),
    averaged over the sequences."""
    shares = []
    with torch.no_grad():
        for i in range(len(dataset)):
            tokens, tags = dataset[i]
            shares.append((model(tokens[None]).argmax(1)[0] == tags).float().mean().item())
    return sum(shares) / len(shares)


def test_variable_length_tagging_with_a_padding_collate_fn_trains_under_ddp_and_scores_no_padding(project, tmp_path):
    run_dir, result, losses = _trained(project, tmp_path / "train", ["experiment=task_tagging", "strategy=ddp", *FAST])
    assert result["processes"] == 2 and result["steps"] == 3 * 512 // 32  # every sample counted, padded or not
    assert losses[-1] < 0.5 * losses[0], losses
    sys.path.insert(0, str(project))
    try:
        from framework.results.trained_model import load_model
        from mypkg.tagging import PadTags, Tagging

        test = Tagging(train=False, size=256)
        tokens, _ = PadTags()([test[i] for i in range(128)])
        padding = (tokens == 0).float().mean().item()
        expected = _token_accuracy_per_sample(load_model(run_dir, which="last", allowed_targets=["mypkg.*"]), test)
    finally:
        sys.path.remove(str(project))
    # a third or more of a padded batch is padding: counted as wrong, accuracy could not pass 1 - padding
    assert padding > 0.3 and expected > 1 - padding + 0.1
    assert result["test_acc"] == pytest.approx(expected, abs=1e-6)
    # the step counts tokens (step.count_tokens): the tags the loss scores, about the mean length per sample
    scalars = read_scalars(run_dir)
    mean_length = sum(len(t) for t in Tagging(train=True).tokens) / 512
    ratios = [t / s for (_, t), (_, s) in zip(scalars["throughput/tokens_per_sec"],
                                              scalars["throughput/samples_per_sec"])]
    assert ratios and all(0.7 * mean_length < r < 1.3 * mean_length for r in ratios), (ratios, mean_length)
    assert "throughput/tokens_per_sec/rank1" in scalars
    # eval.py batches the test split with the run's collate_fn too
    cwd = tmp_path / "eval"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "eval.py"), "--config-dir", str(project / "conf"),
                           *pin_accelerator([f"ckpt_path={run_dir / 'weights' / 'last.pt'}", "strategy=single",
                                             "allowed_targets=[mypkg.*]"])],  # the run folder names mypkg's classes
                          cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **_env(project)}, capture_output=True,
                          text=True, timeout=240)
    check_ok(proc)
    [report] = cwd.rglob("eval.json")
    assert json.loads(report.read_text())["test_acc"] == pytest.approx(expected, abs=1e-6)


def test_an_autoencoder_on_inputs_only_trains_under_ddp_with_its_own_step(project, tmp_path):
    out = check_ok(_run(project, tmp_path, ["experiment=task_autoencoder", "strategy=ddp", *FAST]))
    assert "training AutoEncoder on Codes" in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert result["processes"] == 2 and losses[-1] < 0.5 * losses[0], losses
    mse = [v for _, v in read_scalars(run_dir)["mse/val"]]
    assert mse[-1] < mse[0] and result["test_mse"] == pytest.approx(result["test_loss"], rel=1e-5)


def test_a_model_whose_num_classes_defaults_to_none_trains_on_a_regression(project, tmp_path, monkeypatch):
    from framework.models.build import model_facts

    monkeypatch.syspath_prepend(str(project))
    with allowing(TargetAllowlist(("mypkg.*",))):  # outside a command, only the built-in targets are allowed
        assert model_facts({"_target_": "mypkg.models.FlexibleMLP"}, (8,), None) == {"in_shape": (8,)}
        assert model_facts({"_target_": "mypkg.models.FlexibleMLP"}, (8,), 3) == {"in_shape": (8,), "num_classes": 3}
    run_dir, result, losses = _trained(project, tmp_path, [
        "experiment=task_regression", "model._target_=mypkg.models.FlexibleMLP", "~model.hidden", "strategy=single",
        *FAST])
    assert losses[-1] < 0.5 * losses[0], losses
    assert (run_dir / "weights" / "last.pt").is_file() and torch.load(
        run_dir / "weights" / "last.pt", weights_only=True)["model"]["net.3.weight"].shape == (1, 32)


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


def test_inputs_only_with_the_supervised_step_stop_the_run_with_one_line(project, tmp_path):
    proc = _run(project, tmp_path, ["strategy=ddp", *FAST, *BAD["inputs_only_with_supervised_step"][0]], timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "training " not in proc.stdout
    assert f"error: {BAD['inputs_only_with_supervised_step'][1]}" in proc.stderr, proc.stderr


def test_tokens_are_metered_on_the_device_and_shared_over_a_processs_slots_by_their_size():
    """dp's replicas are one process's slots: a micro-batch's tokens (a device tensor: no sync) go to each slot by its
    share of the batch; a step that counts none leaves the column NaN and no tokens/s tag."""
    from framework.telemetry.meters import TOKENS, IntervalMeter, IntervalSummary

    meter = IntervalMeter([3, 1], torch.device("cpu"), [])
    meter.add_micro_batch(torch.ones(4))
    meter.add_step(1)
    assert IntervalSummary.from_rows(meter.rows()).per_slot_tokens_per_sec == []
    assert meter.rows()[:, TOKENS].isnan().all()
    meter.add_tokens(torch.tensor(8))
    meter.add_tokens(4)
    rows = meter.rows()
    assert rows[:, TOKENS].tolist() == [9.0, 3.0]
    summary = IntervalSummary.from_rows(rows)
    assert summary.tokens == 12 and len(summary.per_slot_tokens_per_sec) == 2


@pytest.mark.slow
def test_the_example_stream_trains_under_ddp_with_dataloader_workers(project, tmp_path):
    run_dir, result, losses = _trained(project, tmp_path, ["experiment=task_stream", "strategy=ddp",
                                                           "trainer.num_workers=2", *FAST])
    assert result["processes"] == 2 and result["test_acc"] > 0.9 and losses[-1] < 0.5 * losses[0], losses
    assert (run_dir / "train.log").read_text().count("the stream gave 2048 samples") == 3


def test_the_example_hf_experiment_passes_the_driver(project, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    pytest.importorskip("transformers", reason="the hf extra")
    pytest.importorskip("datasets", reason="the hf extra")
    assert driver_says(["experiment=hf_text_classifier", "strategy=ddp"], tmp_path, config_dir=project / "conf") == ""
