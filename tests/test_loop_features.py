"""Loop features users of Lightning and lightning-hydra-template expect (issue 32), as real train.py / eval.py runs
where the behaviour is a process: evaluation every N steps driving early stopping and the best checkpoint in a
one-epoch run (and keeping its clock across a resume), the EMA of the weights (checkpointed, weights/ema.pt,
evaluated by eval.py), the debug presets, the model summary in train.log and TensorBoard's Text tab."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from conftest import (REPO, check_ok, composed, driver_says, pin_accelerator,
                      read_scalars, run_dirs, run_train)

# one epoch of 16 steps (1024 samples, batch 64), an evaluation every 4 steps on 256 test samples
ONE_EPOCH = ["dataset.max_train_samples=1024", "dataset.max_test_samples=256", "trainer.epochs=1",
             "trainer.batch_size=64", "trainer.log_every_n_steps=2", "trainer.eval_every_n_steps=4"]


def _only_run(cwd):
    [run_dir] = run_dirs(cwd)
    return run_dir, json.loads((run_dir / "result.json").read_text())


def _eval(cwd, args):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(REPO / "eval.py"), *pin_accelerator(args)], cwd=cwd,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=240)


def test_evaluation_every_n_steps_in_one_epoch_keeps_the_best_checkpoint_and_a_model_summary(tmp_path):
    """Four evaluations in one epoch (none twice at its end), the best of them kept apart and in weights/best.pt;
    the model summary in train.log and in TensorBoard's Text tab."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = check_ok(run_train(["strategy=single", *ONE_EPOCH], tmp_path))
    run_dir, result = _only_run(tmp_path)
    accuracies = dict(read_scalars(run_dir)["acc/val"])
    assert sorted(accuracies) == [4, 8, 12, 16] and result["steps"] == 16
    assert "epoch 1/1 step 4/16 test loss" in out
    best_step = max(accuracies, key=lambda s: (accuracies[s], -s))
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == f"step-{best_step:08d}.json"
    assert torch.load(run_dir / "weights" / "best.pt", weights_only=True)["step"] == best_step

    log = (run_dir / "train.log").read_text()
    assert "model: LeNet, parameters per module" in log
    assert "features    Sequential     25,250       0" in log and "total                     129,068       0" in log
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    [text] = events.Tensors("model/summary/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert "| classifier | Sequential | 103,818 | 0 |" in table and "| total |  | 129,068 | 0 |" in table


def test_frozen_parameters_are_counted_apart():
    from framework.telemetry.model_summary import summarize

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    rows = summarize(model)
    assert [(r.name, r.trainable, r.frozen) for r in rows] == [("0", 3, 12), ("1", 8, 0)]


def test_evaluation_every_n_steps_drives_early_stopping_on_every_ddp_rank(tmp_path):
    """An lr too small to move anything: the objective stops improving, and with patience 1 the evaluation at step
    8 ends the one-epoch run on both ranks; the best (the first evaluation) is kept."""
    out = check_ok(run_train(["strategy=ddp", "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
                              "optimizer.lr=1e-12", *ONE_EPOCH], tmp_path))
    assert "early stopping: acc has not improved" in out and "stopped after epoch 1, step 8" in out
    run_dir, result = _only_run(tmp_path)
    assert result["steps"] == 8 and result["processes"] == 2
    assert [s for s, _ in read_scalars(run_dir)["acc/val"]] == [4, 8]
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == "step-00000004.json"


def test_a_run_resumed_mid_epoch_evaluates_on_the_same_clock_with_the_same_ema(tmp_path):
    """Killed as the evaluation after step 8 of a one-epoch run starts, resumed from the step-8 checkpoint (written
    just before that evaluation): the resumed run evaluates at step 8 first, and its evaluations fall on steps 4, 8,
    12, 16 as an uninterrupted run's do, with the same values; they score the EMA (evaluate_with_ema), so an average
    restarted from the weights at the resume would show, and weights/ema.pt is the reference's."""
    args = ["strategy=single", *ONE_EPOCH, "trainer.checkpoint_every_n_steps=2", "optimizer=sgd", "callbacks=ema",
            "callbacks.ema.decay=0.8", "callbacks.ema.evaluate_with_ema=true"]
    for folder in ("reference", "killed"):
        (tmp_path / folder).mkdir()
    check_ok(run_train(args, tmp_path / "reference"))
    reference, _ = _only_run(tmp_path / "reference")
    assert run_train(args, tmp_path / "killed", faults="kill_in_eval:8:0").returncode != 0
    [run_dir] = run_dirs(tmp_path / "killed")
    out = check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], tmp_path / "killed"))
    assert "step-00000008.pt (step 8" in out
    expected, got = read_scalars(reference)["acc/val"], read_scalars(run_dir)["acc/val"]
    assert [s for s, _ in got] == [4, 8, 12, 16] == [s for s, _ in expected]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected], abs=1e-6)
    ema, ema_reference = (torch.load(d / "weights" / "ema.pt", weights_only=True)["model"] for d in (run_dir, reference))
    last = torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]
    for name, tensor in ema.items():
        assert torch.allclose(tensor.float(), ema_reference[name].float(), rtol=1e-5, atol=1e-6), name
    assert any(not torch.equal(ema[k], last[k]) for k in last), "the average is not the weights"


@pytest.mark.parametrize("strategy", ["ddp", "dp", "horovod"])
def test_ema_weights_evaluate_with_eval_py(tmp_path, strategy):
    """The loop's last evaluation scored the average (evaluate_with_ema) on 2 ddp or horovod ranks, or dp's one
    process (docs/loop-features.md: EMA with single, dp, ddp and horovod); eval.py on weights/ema.pt in one process
    gets the same accuracy."""
    if strategy == "horovod":
        pytest.importorskip("horovod.torch", reason="the horovod extra (make test builds it)")
    (tmp_path / "train").mkdir()
    check_ok(run_train([f"strategy={strategy}", *ONE_EPOCH, "trainer.eval_every_n_steps=null", "callbacks=ema",
                        "callbacks.ema.decay=0.9", "callbacks.ema.evaluate_with_ema=true"], tmp_path / "train"))
    run_dir, result = _only_run(tmp_path / "train")
    out = check_ok(_eval(tmp_path / "eval", [f"ckpt_path={run_dir / 'weights' / 'ema.pt'}", "strategy=single"]))
    [report] = (tmp_path / "eval" / "outputs").rglob("eval.json")
    assert json.loads(report.read_text())["test_acc"] == pytest.approx(result["test_acc"], abs=1e-6), out


def test_ema_averages_every_step_and_swaps_back_exactly():
    """In one process: the average after three steps is decay's EMA of the weights after each (the first step's
    weights start it), and an evaluation inside the swap sees the average while the weights come back bit for bit."""
    from types import SimpleNamespace

    from framework.callbacks.ema import EMA

    model = nn.Linear(3, 1)
    contexts = []
    state = SimpleNamespace(model=model, evaluate_inside=contexts.append)  # the part of LoopState the EMA uses
    ema = EMA(decay=0.5, evaluate_with_ema=True)
    ema.on_fit_start(state)
    expected = None
    for step, value in enumerate([1.0, 3.0, 7.0], start=1):
        with torch.no_grad():
            model.weight.fill_(value)
        ema.on_train_step_end(state, step)
        expected = value if expected is None else 0.5 * expected + 0.5 * value
    assert expected == 4.5 and torch.all(ema.average.module.weight == expected)
    [swap] = contexts
    with swap():
        assert torch.all(model.weight == 4.5)
    assert torch.all(model.weight == 7.0)


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_ema_is_refused_in_the_driver_under_an_engine_that_shards_parameters(tmp_path, strategy):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    assert driver_says([f"strategy={strategy}", "callbacks=ema"], tmp_path) == (
        f"callbacks.ema is not allowed with strategy={strategy}: it averages whole parameters on every rank, which "
        "this engine shards; use single, dp, ddp or horovod")


@pytest.mark.parametrize("override,line", [
    ("callbacks.ema.decay=1.0", "callbacks.ema.decay=1.0 is not allowed: expected a number in [0, 1)"),
    ("callbacks.ema.evaluate_with_ema=maybe",
     "callbacks.ema.evaluate_with_ema='maybe' is not allowed: expected true or false"),
    ("trainer.eval_every_n_steps=0", "trainer.eval_every_n_steps=0 is not allowed: expected an integer >= 1"),
    ("dataset.train_share=0", "dataset.train_share=0.0 is not allowed: expected a number in (0.0, 1.0] or null"),
])
def test_bad_values_of_the_new_keys_are_one_line(tmp_path, override, line):
    said = driver_says(["callbacks=ema", override], tmp_path)
    assert said.startswith(line), said


def test_fast_dev_run_with_ddp_trains_one_step_and_leaves_only_logs(tmp_path):
    start = time.monotonic()
    out = check_ok(run_train(["debug=fast_dev_run", "strategy=ddp"], tmp_path))
    seconds = time.monotonic() - start
    run_dir, result = _only_run(tmp_path)
    assert result["steps"] == 1 and result["processes"] == 2 and "test accuracy" in out
    files = {p.relative_to(run_dir).parts[0] for p in run_dir.rglob("*") if p.is_file()}
    assert not {"checkpoints", "weights", "profile"} & files
    assert {f for f in files if not f.startswith(("events.out.tfevents", "provenance"))} <= {
        ".hydra", "resolved_config.yaml", "result.json", "train.log", "worker_logs"}, files
    print(f"fast_dev_run with ddp: {seconds:.1f} s")


def test_overfit_drives_the_training_loss_down_on_a_few_batches(tmp_path):
    """The preset's 4 batches of 64, here 20 times over (the preset's 50 take long on 2 shared cores)."""
    check_ok(run_train(["debug=overfit", "strategy=single", "trainer.epochs=20", "trainer.log_every_n_steps=4"],
                       tmp_path))
    run_dir, result = _only_run(tmp_path)
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert result["steps"] == 4 * 20 and losses[-1] < 0.5 * losses[0], losses


def test_the_debug_presets_compose_from_existing_keys():
    from framework.config.dataset import DatasetConfig
    from framework.config.typed import typed
    from framework.data.build import build_splits

    limit = composed("debug=limit")
    assert (limit.dataset.train_share, limit.dataset.test_share, limit.trainer.epochs) == (0.05, 0.1, 3)
    profiler = composed("debug=profiler")
    assert list(profiler.trainer.profile) == [3, 6] and profiler.trainer.max_steps == 8
    fast = composed("debug=fast_dev_run", "trainer.batch_size=32")
    assert fast.dataset.max_train_samples == 32 and fast.trainer.keep_checkpoints == 0
    assert sorted(fast.callbacks) == ["console", "tensorboard"]
    assert composed().get("debug") is None and "best" in composed().callbacks

    def splits(*overrides):  # synthetic: 4096 train and 1024 test samples
        node = OmegaConf.to_container(composed("dataset=synthetic", *overrides).dataset, resolve=True)
        return {k: len(v) for k, v in build_splits(typed(DatasetConfig, node, "dataset", open_keys=True)).items()}

    assert splits("+dataset.train_share=0.1", "+dataset.test_share=0.5") == {"train": 410, "test": 512}
    assert splits("+dataset.test_share=0.5", "dataset.max_test_samples=10") == {"train": 4096, "test": 10}
