"""conf/experiment/: one preset per seed tutorial, composed by Hydra and really run (MNIST and CIFAR-10 are
not on this machine: those presets are checked for the missing-data message, and trained on random data of
the same shape)."""
import json
import math
import re

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import REPO, TINY, check_ok, needs_gpus, read_scalars, run_dirs, run_train

SMALL = ["trainer.max_steps=4", "trainer.log_every_n_steps=2"]


def composed(*overrides: str, hydra: bool = False):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def test_presets_compose_to_the_tutorials_settings():
    dp = composed("experiment=dp_tutorial")
    assert dp.model._target_.endswith("LinearModel") and dp.model.print_sizes
    assert (dp.dataset.name, list(dp.dataset.shape), dp.dataset.num_classes, dp.dataset.train_size) == ("synthetic", [5], 2, 100)
    assert (dp.strategy.name, dp.trainer.batch_size) == ("dp", 30)

    d2l = composed("experiment=d2l_lenet_data_parallel")
    assert d2l.model._target_.endswith("LeNet") and d2l.dataset.name == "fashion_mnist"
    assert (d2l.strategy.name, d2l.trainer.batch_size, d2l.optimizer.lr, d2l.trainer.epochs) == ("ddp", 256, 0.2, 10)

    mnist = composed("experiment=simple_cnn_mnist")
    assert mnist.model._target_.endswith("SimpleCNN") and (mnist.dataset.name, mnist.strategy.name) == ("mnist", "ddp")

    cifar = composed("experiment=cifar_net")
    assert cifar.model._target_.endswith("CifarNet") and cifar.dataset.name == "cifar10"
    assert (cifar.trainer.batch_size, cifar.optimizer.lr, cifar.optimizer.momentum) == (4, 0.001, 0.9)

    sweep = composed("experiment=compare_strategies", hydra=True)
    assert sweep.hydra.sweeper.params.strategy.split(",") == ["single", "dp", "ddp", "fsdp"]


def _replica_sizes(out: str) -> list[int]:
    return [int(n) for n in re.findall(r"In Model: input size \((\d+), 5\) output size \(\d+, 2\)", out)]


def test_dp_tutorial_prints_what_each_replica_got(tmp_path):
    out = check_ok(run_train(["experiment=dp_tutorial"], tmp_path))  # on the CPU: one replica takes all 30
    steps = 100 // 30  # the tutorial's 100 samples in batches of 30, the tail dropped
    assert _replica_sizes(out)[:steps] == [30] * steps
    [run_dir] = run_dirs(tmp_path)
    assert json.loads((run_dir / "result.json").read_text())["strategy"] == "dp"


@needs_gpus(2)
def test_dp_tutorial_splits_each_batch_over_every_gpu(tmp_path):
    out = check_ok(run_train(["experiment=dp_tutorial", "trainer.accelerator=gpu"], tmp_path))
    chunks = [len(c) for c in torch.arange(30).chunk(torch.cuda.device_count())]  # nn.DataParallel's scatter
    assert sorted(_replica_sizes(out)[:len(chunks)]) == sorted(chunks)


@pytest.mark.parametrize("preset,dataset", [("simple_cnn_mnist", "mnist"), ("cifar_net", "cifar10")])
def test_presets_without_local_data_stop_with_the_missing_data_message(tmp_path, preset, dataset):
    proc = run_train([f"experiment={preset}", "dataset.download=false", f"dataset.download_dir={tmp_path}"],
                     tmp_path, env={"HYDRA_DIST_DATA": str(tmp_path)}, timeout=60)
    assert proc.returncode != 0
    assert f"error: dataset={dataset}: no usable files found" in proc.stderr
    assert "dataset.download=false" in proc.stderr and "Traceback" not in proc.stderr


def claimed_strategies(preset: str) -> list[str]:
    """The strategies a preset says it trains with: its `# strategies: a, b` line (docs/configuration.md repeats
    it)."""
    text = (REPO / "conf" / "experiment" / f"{preset}.yaml").read_text()
    found = re.search(r"^# strategies: ([\w, ]+?)\s*(\(|$)", text, re.M)
    assert found, f"conf/experiment/{preset}.yaml has no '# strategies: ...' line"
    return [name.strip() for name in found.group(1).split(",")]


# Few steps of each preset on this machine (MNIST and CIFAR-10 as random data of their shape).
SMALL_RUNS = {
    "char_lm": ["model.n_layer=1", "model.n_embd=32", "model.n_head=2", "dataset.block_size=32",
                "trainer.max_steps=6", "trainer.log_every_n_steps=2", "trainer.batch_size=32"],
    "d2l_lenet_data_parallel": [*TINY, *SMALL],
    "dp_tutorial": [],
    "simple_cnn_mnist": ["dataset=synthetic", "dataset.shape=[1,28,28]", *SMALL],
    "cifar_net": ["dataset=synthetic", "dataset.shape=[3,32,32]", *SMALL],
}
CLAIMS = [(preset, strategy) for preset in SMALL_RUNS for strategy in claimed_strategies(preset)]


def test_every_preset_with_a_strategies_line_is_in_the_matrix():
    presets = {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")} - {"compare_strategies"}
    assert presets == set(SMALL_RUNS)


@pytest.mark.parametrize("preset,strategy", CLAIMS)
def test_each_preset_trains_with_every_strategy_it_claims(tmp_path, preset, strategy):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    check_ok(run_train([f"experiment={preset}", f"strategy={strategy}", *SMALL_RUNS[preset]], tmp_path, timeout=300))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == strategy
    if preset == "char_lm":
        losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
        assert result["steps"] == 6 and losses[-1] < losses[0]
        assert result["test_bits_per_char"] == pytest.approx(result["test_loss"] / math.log(2), rel=1e-4)


def test_compare_strategies_runs_one_job_per_strategy(tmp_path):
    out = check_ok(run_train(["-m", "experiment=compare_strategies", *TINY, "trainer.max_steps=2"], tmp_path,
                             timeout=400))
    jobs = run_dirs(tmp_path)
    claimed = claimed_strategies("compare_strategies")
    assert sorted(j.name.split("_", 1)[1] for j in jobs) == sorted(f"strategy={s}" for s in claimed)  # what varies
    assert out.count("| ok |") == len(claimed)
