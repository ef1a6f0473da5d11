"""strategy=fsdp (FSDP2, fully_shard) with 2 gloo workers: trains like one process, holds about half of ddp's optimizer
state per rank, checkpoints through torch.distributed.checkpoint (one shard per rank, committed by the manifest),
resumes its own checkpoints on another world size, resumes a ddp checkpoint and is resumed by ddp, trains in bf16
(listed units, unsharded accumulation, a BatchNorm model) and under torchrun. Real train.py processes; the Adam runs
are shared (support/references.py); accumulation, clipping, the other features and a killed run resumed:
tests/engines/test_rich_runs.py; the refusals: tests/unit/test_engine_options.py (deepspeed refusing an fsdp
checkpoint: here, a real train.py)."""
import json
import math

import pytest

from support.marks import needs_gpu
from support.processes import assert_killed_run_resumes, check_ok, run_train, torchrun
from support.references import ADAM, STEPS, adam
from support.run_files import assert_same_losses, losses_by_step, read_scalars, run_dirs, walk

FSDP = ["strategy=fsdp", "strategy.nproc_per_node=2"]
# fp32. Each rank takes rank::2 of the single process's batch and FSDP averages the two gradients in its
# reduce-scatter; what is left is summation order (about 1e-7 relative, as for ddp).
REL = 1e-5


def reference(runs, name: str):
    return runs.train(adam(name)).ok().run_dir


@pytest.mark.core
def test_two_fsdp_workers_match_one_process_at_every_step(runs):
    single, fsdp = losses_by_step(reference(runs, "single")), losses_by_step(reference(runs, "fsdp"))
    assert sorted(single) == sorted(fsdp) == list(range(1, STEPS + 1))
    assert_same_losses(single, fsdp, range(1, STEPS + 1), REL, ("single", "fsdp"))
    assert single[STEPS] < single[1]
    result = json.loads((reference(runs, "fsdp") / "result.json").read_text())
    assert result["strategy"] == "fsdp" and result["processes"] == 2 and result["steps"] == STEPS
    assert len(result["per_rank_samples_per_sec"]) == 2 and min(result["per_rank_samples_per_sec"]) > 0
    single_result = json.loads((reference(runs, "single") / "result.json").read_text())
    assert result["test_loss"] == pytest.approx(single_result["test_loss"], rel=REL), "evaluation on both ranks"


def test_each_rank_holds_about_half_of_ddps_optimizer_state(runs):
    def per_rank(name):
        scalars = read_scalars(reference(runs, name))
        return [scalars[f"memory/optimizer_state_mib/rank{r}"][-1][1] for r in range(2)]

    full, sharded = per_rank("ddp"), per_rank("fsdp")
    assert min(full) > 0
    for r in range(2):  # Adam's two moments, split by dim 0 of each parameter: close to half, never above 0.6
        assert 0.4 * full[r] < sharded[r] < 0.6 * full[r], f"rank {r}: fsdp {sharded} MiB vs ddp {full} MiB"


def test_checkpoints_are_dcp_shards_committed_by_the_manifest(runs):
    checkpoints = reference(runs, "fsdp") / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("step-*.json")) == ["step-00000008.json", "step-00000012.json"]
    manifest = json.loads((checkpoints / "step-00000012.json").read_text())
    assert manifest["format"] == "dcp" and manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "training_state.pt"} <= set(manifest["files"])
    for name, facts in manifest["files"].items():
        assert (checkpoints / "step-00000012" / name).stat().st_size == facts["bytes"]
    assert not (checkpoints / "step-00000004").exists(), "keep_checkpoints=2 prunes the older folder"


def resumed(runs, args: list[str], checkpoint) -> tuple:
    """A run of its own subject (a checkpoint read by another engine or world size) from a shared run's checkpoint;
    the shared run stays untouched (trainer.resume reads it)."""
    run = runs.train([*args, f"trainer.resume={checkpoint}"]).ok()
    return run.run_dir, run.stdout


def test_resumes_on_one_worker_through_dcp_resharding(runs):
    """A checkpoint written by 2 ranks, read by 1: DCP gathers both shards. The global batch is the same, so the
    one worker trains on the same samples and continues the 2-worker curve."""
    fsdp = reference(runs, "fsdp")
    run_dir, out = resumed(runs, ["strategy=fsdp", "strategy.nproc_per_node=1", *ADAM],
                           fsdp / "checkpoints" / "step-00000008")
    assert "(step 8, " in out
    expected, got = losses_by_step(fsdp), losses_by_step(run_dir)
    assert sorted(got) == list(range(9, STEPS + 1))
    assert_same_losses(expected, got, range(9, STEPS + 1), REL, ("fsdp on 2", "fsdp on 1"))
    assert json.loads((run_dir / "result.json").read_text())["processes"] == 1


def test_resumes_a_ddp_checkpoint(runs):
    """ddp wrote one file with the full model and optimizer; each fsdp rank loads its shards of both."""
    ddp = reference(runs, "ddp")
    run_dir, out = resumed(runs, adam("fsdp"), ddp / "checkpoints" / "step-00000008.pt")
    assert "(step 8, " in out
    expected, got = losses_by_step(ddp), losses_by_step(run_dir)
    assert sorted(got) == list(range(9, STEPS + 1))
    assert_same_losses(expected, got, range(9, STEPS + 1), REL, ("ddp", "fsdp"))


def test_ddp_resumes_an_fsdp_checkpoint(runs):
    """A single-file engine reads DCP shards too (framework/training/dcp.py): each ddp rank loads the whole model and
    optimizer state, and continues fsdp's curve."""
    fsdp = reference(runs, "fsdp")
    run_dir, out = resumed(runs, adam("ddp"), fsdp / "checkpoints" / "step-00000008")
    assert "(step 8, " in out
    expected, got = losses_by_step(fsdp), losses_by_step(run_dir)
    assert sorted(got) == list(range(9, STEPS + 1))
    assert_same_losses(expected, got, range(9, STEPS + 1), REL, ("fsdp", "ddp"))


def test_deepspeed_refuses_an_fsdp_checkpoint_in_the_driver(runs, tmp_path):
    """A real train.py (its exit code is the subject): exit 2 with the one line, before any worker wrote a thing."""
    pytest.importorskip("deepspeed")
    proc = run_train(["strategy=deepspeed", *ADAM, f"trainer.resume={reference(runs, 'fsdp')}"], tmp_path, timeout=180)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    [line] = [text for text in proc.stderr.splitlines() if text.startswith("error:")]
    assert "has format dcp, and strategy=deepspeed reads" in line, proc.stderr
    assert not walk(tmp_path, "checkpoints"), "refused before any worker started"


def test_bf16_listed_units_and_unsharded_accumulation_train(runs):
    """bf16 parameters for compute (fp32 reduction), the Linear and Conv2d layers as units, parameters kept
    unsharded between forward and backward and across the micro-batches of a step."""
    run = runs.train([*FSDP, *ADAM, "trainer.precision=bf16", "strategy.shard_modules=[Linear,Conv2d]",
                      "strategy.reshard_after_forward=false", "trainer.grad_accum=2", "optimizer=sgd"]).ok()
    losses = losses_by_step(run.run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert losses[STEPS] < losses[1]
    assert run.result()["test_acc"] > 0.3


def test_bf16_trains_a_batchnorm_model(runs):
    """MixedPrecisionPolicy(param_dtype=bf16) casts BatchNorm's weight but not its running statistics, and the
    first forward failed ("expected scalar type BFloat16 but found Float"): each BatchNorm is a unit of its own in
    fp32. ResNet-18 on 16x16 images, 2 steps of 2 samples per rank (bf16 convolutions are slow on CPUs) and an
    evaluation (which uses the running statistics)."""
    run = runs.train([*FSDP, "model=resnet18", "trainer.precision=bf16", "dataset=synthetic", "dataset.shape=[3,16,16]",
                      "dataset.train_size=16", "dataset.test_size=8", "trainer.batch_size=4", "trainer.max_steps=2",
                      "trainer.log_every_n_steps=1", "trainer.keep_checkpoints=0"]).ok()
    assert sorted(losses_by_step(run.run_dir)) == [1, 2]
    result = run.result()
    assert result["steps"] == 2 and result["processes"] == 2 and math.isfinite(result["test_loss"])


def test_under_torchrun_like_ddp(tmp_path):
    """torchrun started the workers: fsdp joins them (Strategy.outer_kinds), one run folder, both ranks train. A
    run of its own: its launcher is the subject."""
    out = check_ok(run_train(["strategy=fsdp", *ADAM, "trainer.max_steps=4"], tmp_path, launcher=torchrun()))
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
            f"dataset.max_train_samples={32 * gpus * 32}"]


@needs_gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fsdp_trains_on_every_gpu_with_nccl_and_resumes_after_a_kill(runs, tmp_path, precision):
    import torch

    if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16")
    args = [*_fsdp_on_every_gpu(), *(a for a in ADAM if not a.startswith(("trainer.batch_size=", "dataset.max_train"))),
            f"trainer.precision={precision}"]
    run = runs.train(args).ok()
    result = run.result()
    assert result["device"] == "cuda" and result["processes"] == torch.cuda.device_count() and result["steps"] == STEPS
    assert_killed_run_resumes(tmp_path / "killed", args, "kill_after_step:10:0", run.run_dir, STEPS, resumed_from=8,
                              rel=2e-2)


@needs_gpu
def test_fsdp_cpu_offload_clips_and_resumes_a_batchnorm_model_from_a_file_checkpoint(runs):
    """cpu_offload: sharded gradients in CPU memory are clipped (an all-reduce of CPU tensors, which needs gloo in
    the group beside nccl), and a single-process checkpoint of a model with BatchNorm buffers (which stay on the
    GPU while the parameters' shards are in CPU memory) loads as a full state dict."""
    small = ["model=resnet18", "dataset=synthetic", "dataset.shape=[3,16,16]", "dataset.train_size=512",
             "dataset.test_size=64", "trainer.batch_size=32", "trainer.max_steps=8", "trainer.log_every_n_steps=1",
             "trainer.grad_clip=0.5"]
    single = runs.train(["strategy=single", *small]).ok()
    offload = runs.train([*_fsdp_on_every_gpu()[:2], "strategy.cpu_offload=true", *small, "trainer.max_steps=12",
                          f"trainer.resume={single.run_dir}"]).ok()
    assert "resumed from" in offload.stdout and "(step 8" in offload.stdout
    losses = losses_by_step(offload.run_dir)
    assert sorted(losses) == list(range(9, 13)) and all(v == v for v in losses.values())
