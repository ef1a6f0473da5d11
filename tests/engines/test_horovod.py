"""strategy=horovod: workers started by Horovod's own runner (gloo), real processes, TensorBoard read back: per-rank
throughput, the loss of one process at every step (Adam here; SGD with clipping through HorovodPrecision's path and
accumulation through backward_passes_per_step, with the other features, and a killed run resumed:
tests/engines/test_rich_runs.py), fp16 compression with the sum op, a sweep with ddp, one clear error for a worker's
exception or death, and a signal that stops every worker. The refusals: tests/unit/test_engine_options.py.

The module is skipped only when horovod is not importable; scripts/setup.sh builds it (setup.d/10-horovod.sh)."""
import json
import math
import signal
import uuid

import pytest

from support.marks import needs_gpu
from support.processes import (TINY, check_ok, faults_env, gone_within, held_at, run_train, start_train,
                               user_code_env, wait_until_held)
from support.references import LENET, STEPS, adam
from support.run_files import assert_curves_match, read_scalars, run_dirs

try:
    import horovod.torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"horovod is not importable ({exc}); build it with: bash scripts/setup.d/10-horovod.sh .venv",
                allow_module_level=True)


def _decreasing(series):
    return series[-1][1] < series[0][1]


def test_two_horovod_workers_train_and_log_per_rank_throughput(runs):
    run = runs.train(["strategy=horovod", *TINY]).ok()
    run_dir, out = run.run_dir, run.stdout
    assert run_dir.name.endswith("_horovod_lenet")
    assert "strategy=horovod: no GPU in use, so 2 CPU workers on gloo" in out
    scalars = read_scalars(run_dir)
    for r in (0, 1):
        assert all(v > 0 for _, v in scalars[f"throughput/samples_per_sec/rank{r}"])
        assert _decreasing(scalars[f"loss/train/rank{r}"])
    assert "throughput/samples_per_sec/rank2" not in scalars
    assert _decreasing(scalars["loss/train"])
    result = run.result()
    assert result["strategy"] == "horovod" and result["processes"] == 2
    assert len(result["per_rank_samples_per_sec"]) == 2 and result["test_acc"] > 0.5
    assert out.count("training LeNet") == 1, "progress lines come from rank 0 only"


@pytest.mark.core
def test_horovod_two_workers_match_one_process_at_every_step(runs):
    single = read_scalars(runs.train(adam("single")).ok().run_dir)["loss/train"]
    horovod = read_scalars(runs.train(adam("horovod")).ok().run_dir)["loss/train"]
    assert [s for s, _ in horovod] == list(range(1, STEPS + 1))
    assert_curves_match(single, horovod, 1e-5, ("single", "horovod"))
    assert horovod[-1][1] < horovod[0][1]


def test_fp16_compression_and_sum_op_train(runs):
    run = runs.train(["strategy=horovod", "strategy.compression=fp16", "strategy.op=sum", "optimizer=sgd", *LENET,
                      "trainer.max_steps=16"]).ok()
    scalars = read_scalars(run.run_dir)
    assert _decreasing(scalars["loss/train"])
    # what its compressor handed to the all-reduces: LeNet's 129,068 gradients in fp16, on each rank every step
    assert {v for _, v in scalars["comm/compression_ratio"]} == {2.0}
    assert {v for r in (0, 1) for _, v in scalars[f"comm/bytes_sent/rank{r}"]} == {2 * 129_068}
    assert "| fp16: 2.0x fewer gradient bytes; wait " in run.stdout


def test_fp16_compression_averages_gradients_whose_fp16_sum_would_overflow(runs):
    """Each rank's probe gradient is 40,000 (support/user_code/large_gradients.py): summed in fp16 before Horovod's
    average divides (its default) the two make inf and the loss NaN from step 2; each rank divides first under fp16
    compression (gradient_predivide_factor = world size), so the sum is the mean, 40,000."""
    run = runs.train(["strategy=horovod", "strategy.compression=fp16", "model._target_=large_gradients.ProbedLeNet",
                      *LENET, "trainer.max_steps=4"], env=user_code_env()).ok()
    losses = read_scalars(run.run_dir)["loss/train"]
    assert [s for s, _ in losses] == [1, 2, 3, 4] and all(math.isfinite(v) for _, v in losses)


def test_sweep_over_ddp_and_horovod_makes_one_folder_per_job(runs):
    jobs = runs.train(["-m", "strategy=ddp,horovod", *TINY, "trainer.epochs=1"]).ok().jobs
    assert sorted(j.name.split("_", 1)[1] for j in jobs) == ["strategy=ddp", "strategy=horovod"]  # what varies
    assert len({j.parent for j in jobs}) == 1
    for job in jobs:
        scalars = read_scalars(job)
        assert "throughput/samples_per_sec/rank1" in scalars and "throughput/samples_per_sec/rank2" not in scalars


def test_a_worker_exception_becomes_one_clear_error(runs):
    proc = runs.train(["strategy=horovod", *TINY, "trainer.max_steps=3"], faults="raise_after_step:2:1")
    assert proc.returncode != 0
    assert "error: worker rank 1 failed: RuntimeError: fault injection: an error after step 2" in proc.stderr, proc.stderr


def test_a_killed_worker_stops_the_job_with_a_clear_error(runs):
    proc = runs.train(["strategy=horovod", *TINY, "trainer.max_steps=20"], faults="kill_after_step:2:1")
    assert proc.returncode != 0
    assert "error: worker rank 1 was killed by SIGKILL (exit code 137)" in proc.stderr, proc.stderr
    assert "done: test accuracy" not in proc.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_worker_and_says_how_to_resume(tmp_path, sig):
    """A run of its own: it is stopped. Rank 0 waits at the end of step 6 for the signal."""
    tag = uuid.uuid4().hex
    args = held_at(["strategy=horovod", "trainer.max_steps=400", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
                    "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=512",
                    "dataset.max_test_samples=128"], step=6)
    proc = start_train(args, tmp_path, {**faults_env(), "HYDRA_DIST_TEST_TAG": tag})
    wait_until_held(proc, tmp_path)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    err = (tmp_path / "train.err").read_text()
    left = gone_within(tag, 15)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}; all workers are stopped" in err
    assert "To resume: python train.py" in err
    assert left == [], "no worker process is left behind"


@needs_gpu
def test_horovod_on_gpus_uses_nccl_and_trains(tmp_path):
    import torch

    if not horovod.torch.nccl_built():  # built on a machine without a GPU (scripts/setup.d/10-horovod.sh)
        pytest.skip("horovod was built without NCCL; rebuild it on this GPU machine: .venv/bin/python -m pip "
                    "uninstall -y horovod && bash scripts/setup.d/10-horovod.sh .venv")
    gpus = torch.cuda.device_count()
    out = check_ok(run_train(["strategy=horovod", *TINY, "trainer.epochs=1", "trainer.accelerator=gpu"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["device"] == "cuda" and result["processes"] == gpus
    assert "memory/max_allocated_gib/rank0" in read_scalars(run_dir)
    assert "done: test accuracy" in out
