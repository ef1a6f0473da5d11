"""Loop features users of Lightning and lightning-hydra-template expect, in this process: the EMA's average and its
swap, its refusal under engines that shard parameters, the model summary's counts, the new keys' refusals and the
debug presets. As real runs: tests/runs/test_loop_features.py (evaluation every N steps driving early stopping and
the best checkpoint, the model summary in train.log and TensorBoard, the debug presets) and
tests/engines/test_rich_runs.py (evaluation every N steps, the EMA checkpointed and evaluated by eval.py, and a run
resumed mid-epoch on the same clock with the same average, under every engine)."""
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from support.driver import composed, driver_says


def test_frozen_parameters_are_counted_apart():
    from framework.telemetry.model_summary import summarize

    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    rows = summarize(model)
    assert [(r.name, r.trainable, r.frozen) for r in rows] == [("0", 3, 12), ("1", 8, 0)]


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
