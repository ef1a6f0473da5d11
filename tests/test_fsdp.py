"""strategy=fsdp (FSDP2, fully_shard) with 2 gloo workers: trains like one process (with and without accumulation
and clipping), holds about half of ddp's optimizer state per rank, checkpoints through torch.distributed.checkpoint
(one shard per rank, committed by the manifest), resumes its own checkpoints at the same or another world size,
resumes a ddp checkpoint and is resumed by ddp, and refuses bad settings in the driver. Real train.py processes."""
import json
import math

import pytest

from conftest import (assert_killed_run_resumes, check_ok, driver_says, losses_by_step, needs_gpu, read_scalars, run_dirs,
                      run_train, torchrun)

STEPS = 20
# 32 steps per epoch, so 20 steps stay in epoch 1; a checkpoint every 8 steps (8, 16, and 20 at the end).
COMMON = [f"trainer.max_steps={STEPS}", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
          "trainer.checkpoint_every_n_steps=8", "dataset.max_train_samples=1024", "dataset.max_test_samples=256"]
ADAM = ["optimizer=adam", "trainer.grad_clip=null"]
# SGD (Adam is nearly blind to a gradient's scale, so clipping would hardly show) and a bound the gradient norm
# exceeds on every step.
ACCUMULATE = ["optimizer=sgd", "trainer.grad_accum=2", "trainer.grad_clip=0.05"]
FSDP = ["strategy=fsdp", "strategy.nproc_per_node=2"]
# fp32. Each rank takes rank::2 of the single process's batch and FSDP averages the two gradients in its
# reduce-scatter; what is left is summation order (about 1e-7 relative, as for ddp).
REL = 1e-5


def _run(cwd, args, env=None, timeout=300):
    cwd.mkdir(parents=True, exist_ok=True)
    return run_train(args, cwd, env=env, timeout=timeout)


def _train(cwd, args, env=None):
    out = check_ok(_run(cwd, args, env))
    [run_dir] = run_dirs(cwd)
    return run_dir, out


def assert_same_losses(reference: dict, other: dict, steps, names):
    for step in steps:
        assert abs(other[step] - reference[step]) <= REL * abs(reference[step]), (
            f"step {step}: {names[0]} {reference[step]} vs {names[1]} {other[step]}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """single, ddp and fsdp on the same config (Adam, no clipping): run folder by name."""
    root = tmp_path_factory.mktemp("fsdp_runs")
    return {name: _train(root / name, [*args, *ADAM, *COMMON])[0] for name, args in [
        ("single", ["strategy=single"]), ("ddp", ["strategy=ddp", "strategy.nproc_per_node=2"]), ("fsdp", FSDP)]}


def test_two_fsdp_workers_match_one_process_for_twenty_steps(runs):
    single, fsdp = losses_by_step(runs["single"]), losses_by_step(runs["fsdp"])
    assert sorted(single) == sorted(fsdp) == list(range(1, STEPS + 1))
    assert_same_losses(single, fsdp, range(1, STEPS + 1), ("single", "fsdp"))
    assert single[STEPS] < single[1]
    result = json.loads((runs["fsdp"] / "result.json").read_text())
    assert result["strategy"] == "fsdp" and result["processes"] == 2 and result["steps"] == STEPS
    assert len(result["per_rank_samples_per_sec"]) == 2 and min(result["per_rank_samples_per_sec"]) > 0
    single_result = json.loads((runs["single"] / "result.json").read_text())
    assert result["test_loss"] == pytest.approx(single_result["test_loss"], rel=REL), "evaluation on both ranks"


def test_accumulation_and_clipping_match_one_process(tmp_path):
    """Non-final micro-batches skip the reduce-scatter; clipping measures the global norm of the sharded
    gradients. The same losses as one process doing the same."""
    single, _ = _train(tmp_path / "single", ["strategy=single", *COMMON, *ACCUMULATE])
    fsdp, _ = _train(tmp_path / "fsdp", [*FSDP, *COMMON, *ACCUMULATE])
    a, b = losses_by_step(single), losses_by_step(fsdp)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    assert_same_losses(a, b, range(1, STEPS + 1), ("single", "fsdp"))


def test_each_rank_holds_about_half_of_ddps_optimizer_state(runs):
    def per_rank(name):
        scalars = read_scalars(runs[name])
        return [scalars[f"memory/optimizer_state_mib/rank{r}"][-1][1] for r in range(2)]

    full, sharded = per_rank("ddp"), per_rank("fsdp")
    assert min(full) > 0
    for r in range(2):  # Adam's two moments, split by dim 0 of each parameter: close to half, never above 0.6
        assert 0.4 * full[r] < sharded[r] < 0.6 * full[r], f"rank {r}: fsdp {sharded} MiB vs ddp {full} MiB"


def test_checkpoints_are_dcp_shards_committed_by_the_manifest(runs):
    checkpoints = runs["fsdp"] / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step-*.json")) == ["step-00000016.json", "step-00000020.json"]
    manifest = json.loads((checkpoints / "step-00000020.json").read_text())
    assert manifest["format"] == "dcp" and manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "training_state.pt"} <= set(manifest["files"])
    for name, facts in manifest["files"].items():
        assert (checkpoints / "step-00000020" / name).stat().st_size == facts["bytes"]
    assert not (checkpoints / "step-00000008").exists(), "keep_checkpoints=2 prunes the older folder"


def test_a_stopped_run_resumes_with_resume_auto_and_continues_the_curve(runs, tmp_path):
    assert_killed_run_resumes(tmp_path, [*FSDP, *ADAM, *COMMON], "kill_after_step:12:1", runs["fsdp"], STEPS,
                              resumed_from=8)


def test_resumes_on_one_worker_through_dcp_resharding(runs, tmp_path):
    """A checkpoint written by 2 ranks, read by 1: DCP gathers both shards. The global batch is the same, so the
    one worker trains on the same samples and continues the 2-worker curve."""
    checkpoint = runs["fsdp"] / "checkpoints" / "step-00000016"
    run_dir, out = _train(tmp_path, ["strategy=fsdp", "strategy.nproc_per_node=1", *ADAM, *COMMON,
                                     f"trainer.resume={checkpoint}"])
    assert "(step 16, " in out
    expected, got = losses_by_step(runs["fsdp"]), losses_by_step(run_dir)
    assert sorted(got) == list(range(17, STEPS + 1))
    assert_same_losses(expected, got, range(17, STEPS + 1), ("fsdp on 2", "fsdp on 1"))
    assert json.loads((run_dir / "result.json").read_text())["processes"] == 1


def test_resumes_a_ddp_checkpoint(runs, tmp_path):
    """ddp wrote one file with the full model and optimizer; each fsdp rank loads its shards of both."""
    checkpoint = runs["ddp"] / "checkpoints" / "step-00000016.pt"
    run_dir, out = _train(tmp_path, [*FSDP, *ADAM, *COMMON, f"trainer.resume={checkpoint}"])
    assert "(step 16, " in out
    expected, got = losses_by_step(runs["ddp"]), losses_by_step(run_dir)
    assert sorted(got) == list(range(17, STEPS + 1))
    assert_same_losses(expected, got, range(17, STEPS + 1), ("ddp", "fsdp"))


def test_ddp_resumes_an_fsdp_checkpoint(runs, tmp_path):
    """A single-file engine reads DCP shards too (framework/training/dcp.py): each ddp rank loads the whole model and
    optimizer state, and continues fsdp's curve."""
    checkpoint = runs["fsdp"] / "checkpoints" / "step-00000016"
    run_dir, out = _train(tmp_path, ["strategy=ddp", "strategy.nproc_per_node=2", *ADAM, *COMMON,
                                     f"trainer.resume={checkpoint}"])
    assert "(step 16, " in out
    expected, got = losses_by_step(runs["fsdp"]), losses_by_step(run_dir)
    assert sorted(got) == list(range(17, STEPS + 1))
    assert_same_losses(expected, got, range(17, STEPS + 1), ("fsdp", "ddp"))


def test_deepspeed_refuses_an_fsdp_checkpoint_in_the_driver(runs, tmp_path):
    pytest.importorskip("deepspeed")
    proc = _run(tmp_path, ["strategy=deepspeed", *ADAM, *COMMON, f"trainer.resume={runs['fsdp']}"], timeout=120)
    assert proc.returncode != 0
    assert "has format dcp, and strategy=deepspeed reads" in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("checkpoints")), "refused before any worker started"


def test_bf16_listed_units_and_unsharded_accumulation_train(tmp_path):
    """bf16 parameters for compute (fp32 reduction), the Linear and Conv2d layers as units, parameters kept
    unsharded between forward and backward and across the micro-batches of a step."""
    run_dir, out = _train(tmp_path, [*FSDP, *COMMON, "trainer.precision=bf16", "strategy.shard_modules=[Linear,Conv2d]",
                                     "strategy.reshard_after_forward=false", "trainer.grad_accum=2", "optimizer=sgd"])
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    assert json.loads((run_dir / "result.json").read_text())["test_acc"] > 0.3


def test_bf16_trains_a_batchnorm_model(tmp_path):
    """MixedPrecisionPolicy(param_dtype=bf16) casts BatchNorm's weight but not its running statistics, and the
    first forward failed ("expected scalar type BFloat16 but found Float"): each BatchNorm is a unit of its own in
    fp32. ResNet-18 on 16x16 images, 2 steps of 2 samples per rank (bf16 convolutions are slow on CPUs) and an
    evaluation (which uses the running statistics)."""
    run_dir, _ = _train(tmp_path, [*FSDP, "model=resnet18", "trainer.precision=bf16", "dataset=synthetic",
                                   "dataset.shape=[3,16,16]", "dataset.train_size=16", "dataset.test_size=8",
                                   "trainer.batch_size=4", "trainer.max_steps=2", "trainer.log_every_n_steps=1",
                                   "trainer.keep_checkpoints=0"])
    assert sorted(losses_by_step(run_dir)) == [1, 2]
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 2 and result["processes"] == 2 and math.isfinite(result["test_loss"])


@pytest.mark.parametrize("overrides,message", [
    (["strategy.shard_modules=[NoSuchBlock]"],
     "strategy.shard_modules=['NoSuchBlock'] is not allowed: LeNet has no submodule of class NoSuchBlock"),
    (["strategy.shard_modules=[]"], "strategy.shard_modules=[] is not allowed: expected auto"),
    (["strategy.shard_modules=every"], "strategy.shard_modules='every' is not allowed: expected auto"),
    (["strategy.reshard_after_forward=maybe"],
     "strategy.reshard_after_forward='maybe' is not allowed: expected true or false"),
    (["strategy.cpu_offload=true"], "strategy.cpu_offload=true is not allowed without GPUs"),
    (["trainer.precision=fp16"], "trainer.precision=fp16 is not allowed with strategy=fsdp"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=fsdp"),
])
def test_bad_values_fail_in_the_driver(tmp_path, overrides, message):
    line = driver_says([*FSDP, *COMMON, *overrides], tmp_path)  # in this process: tests/test_bad_inputs.py says why
    assert message in line, line


def test_under_torchrun_like_ddp(tmp_path):
    """torchrun started the workers: fsdp joins them (Strategy.outer_kinds), one run folder, both ranks train."""
    out = check_ok(run_train(["strategy=fsdp", *COMMON, "trainer.max_steps=4"], tmp_path, launcher=torchrun()))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "fsdp" and result["processes"] == 2 and result["steps"] == 4
    assert json.loads((run_dir / "checkpoints" / "step-00000004.json").read_text())["format"] == "dcp"


# ---- GPU ------------------------------------------------------------------------------------------------------

def _fsdp_on_every_gpu():
    import torch

    gpus = torch.cuda.device_count()
    return ["strategy=fsdp", f"strategy.nproc_per_node={gpus}", f"trainer.batch_size={32 * gpus}",
            f"dataset.max_train_samples={32 * gpus * STEPS}"]


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp_trains_on_every_gpu_with_nccl_and_resumes_after_a_kill(tmp_path, precision):
    import torch

    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16")
    args = [*_fsdp_on_every_gpu(), *(a for a in COMMON if not a.startswith(("trainer.batch_size=", "dataset.max_train"))),
            f"trainer.precision={precision}"]
    reference, _ = _train(tmp_path / "reference", args)
    result = json.loads((reference / "result.json").read_text())
    assert result["device"] == "cuda" and result["processes"] == torch.cuda.device_count() and result["steps"] == STEPS
    assert_killed_run_resumes(tmp_path / "killed", args, "kill_after_step:10:0", reference, STEPS, resumed_from=8,
                              rel=2e-2)


@needs_gpu
def test_fsdp_cpu_offload_clips_and_resumes_a_batchnorm_model_from_a_file_checkpoint(tmp_path):
    """cpu_offload: sharded gradients in CPU memory are clipped (an all-reduce of CPU tensors, which needs gloo in
    the group beside nccl), and a single-process checkpoint of a model with BatchNorm buffers (which stay on the
    GPU while the parameters' shards are in CPU memory) loads as a full state dict."""
    small = ["model=resnet18", "dataset=synthetic", "dataset.shape=[3,16,16]", "dataset.train_size=512",
             "dataset.test_size=64", "trainer.batch_size=32", "trainer.max_steps=8", "trainer.log_every_n_steps=1",
             "trainer.grad_clip=0.5"]
    single, _ = _train(tmp_path / "single", ["strategy=single", *small])
    offload = [*_fsdp_on_every_gpu()[:2], "strategy.cpu_offload=true", *small, "trainer.max_steps=12",
               f"trainer.resume={single}"]
    run_dir, out = _train(tmp_path / "offload", offload)
    assert "resumed from" in out and "(step 8" in out
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(9, 13)) and all(v == v for v in losses.values())
