"""conf/experiment/: each preset really trains with every strategy it claims (MNIST and CIFAR-10 are not on this
machine: those presets train on random data of the same shape), one sweep per preset (a job per strategy, one
interpreter's start-up); the dp tutorial prints what each replica got; compare_strategies runs its own sweep. The
composition, the matrix and the missing-data message: tests/unit/test_experiments.py."""
import importlib.util
import json
import math
import re

import pytest
import torch

from support.marks import needs_gpus
from support.presets import SMALL_RUNS, claimed_strategies
from support.processes import TINY, check_ok, run_train
from support.run_files import read_scalars

CLAIMS = [(preset, strategy) for preset in SMALL_RUNS for strategy in claimed_strategies(preset)]


def _installed(strategy: str) -> bool:
    return strategy != "deepspeed" or importlib.util.find_spec("deepspeed") is not None


def preset_jobs(runs, preset: str) -> dict:
    """The preset trained with each strategy it claims (and this machine has): job folder by strategy. One claim is
    a run; several are a sweep."""
    strategies = [s for s in claimed_strategies(preset) if _installed(s)]
    if len(strategies) == 1:
        return {strategies[0]: runs.train([f"experiment={preset}", f"strategy={strategies[0]}",
                                           *SMALL_RUNS[preset]]).ok().run_dir}
    sweep = runs.train(["-m", f"experiment={preset}", f"strategy={','.join(strategies)}", *SMALL_RUNS[preset]],
                       timeout=900).ok()
    return {job.name.split("strategy=", 1)[1]: job for job in sweep.jobs}


@pytest.mark.parametrize("preset,strategy", CLAIMS)
def test_each_preset_trains_with_every_strategy_it_claims(runs, preset, strategy):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed")
    run_dir = preset_jobs(runs, preset)[strategy]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == strategy
    if preset == "char_lm":
        losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
        assert result["steps"] == 6 and losses[-1] < losses[0]
        assert result["test_bits_per_char"] == pytest.approx(result["test_loss"] / math.log(2), rel=1e-4)


def _replica_sizes(out: str) -> list[int]:
    return [int(n) for n in re.findall(r"In Model: input size \((\d+), 5\) output size \(\d+, 2\)", out)]


def test_dp_tutorial_prints_what_each_replica_got(runs):
    """On the CPU: one replica takes all 30 (the preset's run of the matrix above)."""
    run_dir = preset_jobs(runs, "dp_tutorial")["dp"]
    out = runs.train(["experiment=dp_tutorial", "strategy=dp"]).stdout
    steps = 100 // 30  # the tutorial's 100 samples in batches of 30, the tail dropped
    assert _replica_sizes(out)[:steps] == [30] * steps
    assert json.loads((run_dir / "result.json").read_text())["strategy"] == "dp"


@needs_gpus(2)
def test_dp_tutorial_splits_each_batch_over_every_gpu(tmp_path):
    out = check_ok(run_train(["experiment=dp_tutorial", "trainer.accelerator=gpu"], tmp_path))
    chunks = [len(c) for c in torch.arange(30).chunk(torch.cuda.device_count())]  # nn.DataParallel's scatter
    assert sorted(_replica_sizes(out)[:len(chunks)]) == sorted(chunks)


def test_compare_strategies_runs_one_job_per_strategy(runs):
    sweep = runs.train(["-m", "experiment=compare_strategies", *TINY, "trainer.max_steps=2"], timeout=600).ok()
    claimed = claimed_strategies("compare_strategies")
    assert sorted(j.name.split("_", 1)[1] for j in sweep.jobs) == sorted(f"strategy={s}" for s in claimed)
    assert sweep.stdout.count("| ok |") == len(claimed)
