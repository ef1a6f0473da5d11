"""Users' own data shapes as real train.py and eval.py runs (examples/my_project): variable-length samples padded by the
user's collate_fn, samples that are inputs only with a step of the user's own, a model whose num_classes defaults to
None, a stream with DataLoader workers, and the supervised step refused for inputs only. In-process:
tests/unit/test_user_data.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

from framework.config.targets import TargetAllowlist, allowing
from support.processes import REPO, check_ok, pin_accelerator, run_train
from support.run_cache import example_project
from support.run_files import read_scalars, run_dirs, walk

FAST = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=adam",
        "optimizer.lr=0.01", "lr_schedule=constant"]

@pytest.fixture(scope="module")
def project(runs):
    return example_project(runs).root


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
        from mypkg.tagging import PadTags, Tagging

        from framework.results.trained_model import load_model

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
    [report] = walk(cwd, "eval.json")
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


# the in-process refusals: tests/unit/test_user_data.py; this one as a real process too
SUPERVISED_STEP_FOR_INPUTS_ONLY = (["experiment=task_autoencoder", "step=supervised"],
                                   "dataset.train[0] is a Tensor, not an (input, target) pair; "
                                   "step=framework.training.step.Supervised needs (inputs, targets): for inputs only")


def test_inputs_only_with_the_supervised_step_stop_the_run_with_one_line(project, tmp_path):
    proc = _run(project, tmp_path, ["strategy=ddp", *FAST, *SUPERVISED_STEP_FOR_INPUTS_ONLY[0]], timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "training " not in proc.stdout
    assert f"error: {SUPERVISED_STEP_FOR_INPUTS_ONLY[1]}" in proc.stderr, proc.stderr



def test_the_example_stream_trains_under_ddp_with_dataloader_workers(project, tmp_path):
    run_dir, result, losses = _trained(project, tmp_path, ["experiment=task_stream", "strategy=ddp",
                                                           "trainer.num_workers=2", *FAST])
    assert result["processes"] == 2 and result["test_acc"] > 0.9 and losses[-1] < 0.5 * losses[0], losses
    assert (run_dir / "train.log").read_text().count("the stream gave 2048 samples") == 3
