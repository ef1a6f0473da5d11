"""strategy=deepspeed: ZeRO 0-3 with 2 gloo workers (DeepSpeed's cpu accelerator) trains like one process,
resumes from its own sharded checkpoints, shows ZeRO's optimizer-state savings per rank in TensorBoard,
and refuses bad settings in the driver. The first run on a machine builds DeepSpeed's shared-memory
op (about a minute, cached under ~/.cache/torch_extensions)."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import (REPO, TRAIN, assert_killed_run_resumes, check_ok, driver_says, kill_in_checkpoint, losses_by_step,
                      needs_gpu, pin_accelerator, read_scalars, run_dirs, run_train, strategy_for, torchrun)

try:
    import deepspeed  # noqa: F401  (only to know whether it is installed; the runs import it themselves)
except ImportError:
    pytest.skip("DeepSpeed is not installed (pip install '.[deepspeed]' or make setup)", allow_module_level=True)

from framework.models.lenet import LeNet  # noqa: E402
from framework.strategies.deepspeed import DeepSpeedPrecision, state_module_by_module  # noqa: E402

STEPS = 12
# 32 steps per epoch, so 12 steps stay in epoch 1; a checkpoint every 4 steps; a loss point every step.
COMMON = [f"trainer.max_steps={STEPS}", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
          "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=1024", "dataset.max_test_samples=256",
          "optimizer=adam"]
DEEPSPEED = ["strategy=deepspeed", "strategy.nproc_per_node=2"]
STAGES = (0, 1, 2, 3)
# fp32. Each rank takes rank::2 of the single process's batch and the engine averages the two gradients, so the
# only differences are summation order (the all-reduce, or ZeRO's reduce-scatter over flattened buckets) and
# Adam run on flat partitions instead of per-tensor: about 1e-7 relative in the loss, measured. 1e-5 is the
# bound the ddp equivalence test uses too.
REL = 1e-5


def _run(cwd, args, env=None, timeout=300):
    cwd.mkdir(parents=True, exist_ok=True)
    return run_train(args, cwd, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One single-process run and one 2-worker run per ZeRO stage, same config: folder by name."""
    root = tmp_path_factory.mktemp("deepspeed_runs")
    folders = {}
    for name, args in [("single", ["strategy=single"])] + [
            (f"zero{s}", [*DEEPSPEED, f"strategy.zero_stage={s}"]) for s in STAGES]:
        check_ok(_run(root / name, [*args, *COMMON]))
        [folders[name]] = run_dirs(root / name)
    return folders


@pytest.mark.parametrize("stage", STAGES)
def test_zero_stage_with_two_workers_matches_one_process(runs, stage):
    single, ds = losses_by_step(runs["single"]), losses_by_step(runs[f"zero{stage}"])
    assert sorted(single) == sorted(ds) == list(range(1, STEPS + 1))
    for step in range(1, 11):
        assert abs(ds[step] - single[step]) <= REL * abs(single[step]), f"step {step}: single {single[step]} vs ZeRO-{stage} {ds[step]}"
    assert single[STEPS] < single[1]
    result = json.loads((runs[f"zero{stage}"] / "result.json").read_text())
    assert result["strategy"] == "deepspeed" and result["processes"] == 2 and result["steps"] == STEPS
    assert len(result["per_rank_samples_per_sec"]) == 2 and min(result["per_rank_samples_per_sec"]) > 0


@pytest.fixture(scope="module")
def accumulated_single(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("accumulated_single")
    check_ok(_run(cwd, ["strategy=single", *ACCUMULATE]))
    [run_dir] = run_dirs(cwd)
    return run_dir


# SGD (Adam would hide clipping: it is nearly invariant to the gradient's scale) and a clip bound that the
# gradient norm exceeds on every step.
ACCUMULATE = ["trainer.grad_accum=2", "trainer.grad_clip=0.05", "optimizer=sgd",
              *(a for a in COMMON if a != "optimizer=adam")]


@pytest.mark.parametrize("stage", [1, 3])
def test_gradient_accumulation_and_clipping_match_one_process(accumulated_single, tmp_path, stage):
    """The loop calls backward per micro-batch (loss / grad_accum) and the step once; DeepSpeed counts its own
    accumulation boundary and clips to gradient_clipping there. Same losses as one process doing the same."""
    check_ok(_run(tmp_path, [*DEEPSPEED, f"strategy.zero_stage={stage}", *ACCUMULATE]))
    [run_dir] = run_dirs(tmp_path)
    single, ds = losses_by_step(accumulated_single), losses_by_step(run_dir)
    assert sorted(single) == sorted(ds) == list(range(1, STEPS + 1))
    for step in range(1, 11):
        assert abs(ds[step] - single[step]) <= REL * abs(single[step]), f"step {step}: single {single[step]} vs ZeRO-{stage} {ds[step]}"
    config = json.loads((run_dir / "deepspeed_config.json").read_text())
    assert config["gradient_accumulation_steps"] == 2 and config["gradient_clipping"] == 0.05
    assert config["train_micro_batch_size_per_gpu"] == 8


def test_run_folder_holds_the_deepspeed_config_and_sharded_checkpoints(runs):
    run_dir = runs["zero2"]
    config = json.loads((run_dir / "deepspeed_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 2
    assert config["train_batch_size"] == 32 and config["train_micro_batch_size_per_gpu"] == 16
    assert config["gradient_accumulation_steps"] == 1 and config["bf16"] == {"enabled": False}
    checkpoints = run_dir / "checkpoints"
    manifests = sorted(p.name for p in checkpoints.glob("step-*.json"))
    assert manifests == ["step-00000008.json", "step-00000012.json"], "keep_checkpoints=2 prunes the older ones"
    assert not (checkpoints / "step-00000004").exists()
    manifest = json.loads((checkpoints / "step-00000012.json").read_text())
    assert manifest["format"] == "deepspeed-zero2" and manifest["world_size"] == 2
    shards = [name for name in manifest["files"] if "optim_states" in name]
    assert len(shards) == 2, f"one optimizer shard per rank: {sorted(manifest['files'])}"
    for name, facts in manifest["files"].items():
        assert (checkpoints / "step-00000012" / name).stat().st_size == facts["bytes"]


def test_a_damaged_shard_makes_resume_fall_back_to_the_checkpoint_before(runs, tmp_path):
    from framework.checkpoints.store import newest_valid

    folder = tmp_path / "checkpoints"
    shutil.copytree(runs["zero2"] / "checkpoints", folder)
    shard = folder / "step-00000012" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    warnings = []
    assert newest_valid(folder, warnings.append).step == 8
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt: it is truncated" in warnings[0]


def test_zero_1_and_2_hold_less_optimizer_state_per_rank_than_zero_0(runs):
    def per_rank(stage):
        scalars = read_scalars(runs[f"zero{stage}"])
        return [scalars[f"memory/optimizer_state_mib/rank{r}"][-1][1] for r in range(2)]

    full = per_rank(0)
    assert min(full) > 0
    for stage in (1, 2, 3):
        sharded = per_rank(stage)
        # Adam keeps two fp32 moments per parameter; ZeRO gives each of 2 ranks about half of them.
        assert max(sharded) < 0.6 * min(full), f"ZeRO-{stage} {sharded} MiB vs ZeRO-0 {full} MiB per rank"


def test_wait_time_is_measured_for_zero_0_to_2_and_not_reported_for_zero_3(runs):
    """ZeRO-3's fast rank waits inside the parameter all-gathers of forward, which the clock cannot separate from
    work: no wait tag rather than a misleadingly small one (and busy is then the whole step)."""
    for stage in STAGES:
        scalars = read_scalars(runs[f"zero{stage}"])
        assert all(v > 0 for _, v in scalars["time/busy_ms/rank1"])
        assert ("time/wait_ms/rank0" in scalars) == (stage < 3), f"ZeRO-{stage}"


@pytest.mark.parametrize("stage", [3])  # the other stages save and load through the same path (stage 2 below)
def test_worker_killed_while_writing_a_checkpoint_resumes_the_same_loss_curve(runs, tmp_path, stage):
    """Rank 0 dies halfway through the step-8 checkpoint; the restarted group ignores that uncommitted folder,
    resumes from step 4 and continues the uninterrupted run's loss curve."""
    out = check_ok(_run(tmp_path, [*DEEPSPEED, f"strategy.zero_stage={stage}", "strategy.max_restarts=1", *COMMON],
                        env=kill_in_checkpoint(8, 0)))
    assert "fault injection: SIGKILL" in out and "(step 4, " in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == 4 and result["steps"] == STEPS
    expected, got = losses_by_step(runs[f"zero{stage}"]), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    folders = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir())
    assert folders == ["step-00000008", "step-00000012"], "every shard folder left is a committed checkpoint"
    assert all((run_dir / "checkpoints" / f"{name}.json").is_file() for name in folders)


def test_a_stopped_run_resumes_with_resume_auto(runs, tmp_path):
    """A worker dies (no restarts): the run fails; the same command with hydra.run.dir picks it up."""
    assert_killed_run_resumes(tmp_path, [*DEEPSPEED, "strategy.zero_stage=2", *COMMON], "kill_after_step:10:1",
                              runs["zero2"], STEPS, resumed_from=8)


def test_a_deepspeed_checkpoint_is_not_resumed_by_another_stage_or_strategy(runs, tmp_path):
    for args in (["strategy=deepspeed", "strategy.zero_stage=3"], ["strategy=ddp"]):
        proc = _run(tmp_path, [*args, *COMMON, f"trainer.resume={runs['zero2']}"])
        assert proc.returncode != 0
        assert "has format deepspeed-zero2" in proc.stderr, proc.stderr
    assert not list(tmp_path.rglob("checkpoints")), "refused before any worker started"


@pytest.mark.parametrize("workers", [1, 4])
def test_a_zero_checkpoint_is_not_resumed_on_another_world_size(runs, tmp_path, workers):
    """ZeRO partitions follow the world size that wrote them: refused in the driver, saying why and what to do."""
    proc = _run(tmp_path, ["strategy=deepspeed", "strategy.zero_stage=2", f"strategy.nproc_per_node={workers}",
                           *COMMON, f"trainer.resume={runs['zero2']}"], timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"is not allowed with {workers} worker(s): checkpoint" in proc.stderr
            and "holds deepspeed-zero2 shards of 2 workers, and strategy=deepspeed cannot reshard them" in proc.stderr
            and "Use 2 workers (e.g. strategy.nproc_per_node=2 on one node)" in proc.stderr), proc.stderr
    assert not list(tmp_path.rglob("checkpoints")), "refused before any worker started"


@pytest.mark.parametrize("overrides,message", [
    (["strategy.zero_stage=4"], "strategy.zero_stage=4 is not allowed: expected 0, 1, 2 or 3"),
    (["strategy.zero_stage=0", "strategy.offload_optimizer=true"],
     "strategy.offload_optimizer=true is not allowed with strategy.zero_stage=0"),
    (["+strategy.config.gradient_accumulation_steps=4"],
     "strategy.config.gradient_accumulation_steps=4 is not allowed: it contradicts trainer.grad_accum=1"),
    (["strategy.zero_stage=1", "+strategy.config.zero_optimization.stage=3"],
     "strategy.config.zero_optimization.stage=3 is not allowed: it contradicts strategy.zero_stage=1"),
    (["+strategy.config.optimizer.type=Adam"], "strategy.config.optimizer is not allowed"),
    (["trainer.on_nonfinite=skip"], "trainer.on_nonfinite=skip is not allowed with strategy=deepspeed"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=deepspeed"),
    (["strategy.zero_stage=0", "trainer.precision=fp16"],
     "trainer.precision=fp16 is not allowed with strategy=deepspeed on the CPU"),
    *((["trainer.precision=fp16", f"strategy.zero_stage={stage}"],
       f"trainer.precision=fp16 is not allowed with strategy=deepspeed strategy.zero_stage={stage}: DeepSpeed's ZeRO "
       "optimizer (stages 1-3) clips fp16's still-scaled gradients and never lowers its loss scale; use "
       "trainer.precision=bf16, or strategy.zero_stage=0") for stage in (1, 2, 3)),
])
def test_bad_values_fail_in_the_driver(tmp_path, overrides, message):
    line = driver_says([*DEEPSPEED, *overrides, *COMMON], tmp_path)  # in this process: test_bad_inputs.py says why
    assert message in line, line


def test_without_deepspeed_the_strategy_says_how_to_install_it_and_others_never_import_it(tmp_path):
    # The same train.py, with `import deepspeed` made to fail as if the package were not installed.
    hide = ("import sys, runpy; sys.modules['deepspeed'] = None; "
            f"sys.argv = [{str(TRAIN)!r}] + sys.argv[1:]; runpy.run_path({str(TRAIN)!r}, run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", hide, *pin_accelerator([*DEEPSPEED, *COMMON])], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode != 0
    assert "DeepSpeed is not installed" in proc.stderr and "pip install '.[deepspeed]'" in proc.stderr, proc.stderr
    check = ("import sys, framework.run, framework.worker, framework.strategies; "
             "sys.exit('deepspeed' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", check], cwd=REPO, timeout=120).returncode == 0


def test_under_torchrun_deepspeed_uses_the_started_workers(tmp_path):
    out = check_ok(run_train(["strategy=deepspeed", "strategy.zero_stage=1", *COMMON], tmp_path, launcher=torchrun()))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "deepspeed" and result["processes"] == 2 and result["steps"] == STEPS
    assert (run_dir / "deepspeed_config.json").is_file() and (run_dir / "checkpoints" / "step-00000012.json").is_file()


@pytest.mark.parametrize("precision,dtype", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", None)])
def test_mixed_precision_is_deepspeeds_own_autocast_and_no_autocast_of_ours_wraps_the_engine(precision, dtype):
    """DeepSpeed >= 0.17.6 turns an outer torch.autocast off inside engine.forward, while its bf16/fp16 sections
    cast the parameters: fp32 images into a bf16 Conv2d failed at step 1 on every GPU. The engine gets its own
    torch_autocast section (parameters stay fp32) and the loop's autocast around it is none. torch.is_autocast_enabled
    is asked per device type: without one it reports CUDA only."""
    config = strategy_for("strategy=deepspeed", f"trainer.precision={precision}").engine_config(2)
    assert config["torch_autocast"] == ({"enabled": True, "dtype": dtype} if dtype else {"enabled": False})
    assert config["bf16"] == {"enabled": False} and config["fp16"] == {"enabled": False}
    with DeepSpeedPrecision(precision, torch.device("cpu"), engine=None).autocast():
        assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")


def test_bf16_trains_in_bf16_with_fp32_weights_and_evaluates_the_same_way(runs, tmp_path):
    """ZeRO-2, 2 gloo workers, trainer.precision=bf16: the engine computes in bf16 (the loss curve leaves the fp32
    run's by more than summation order, and stays near it), the weights it exports are fp32."""
    run_dir = tmp_path / "bf16"
    check_ok(_run(run_dir, [*DEEPSPEED, "strategy.zero_stage=2", "trainer.precision=bf16", *COMMON]))
    [run_dir] = run_dirs(run_dir)
    bf16, fp32 = losses_by_step(run_dir), losses_by_step(runs["zero2"])
    assert sorted(bf16) == list(range(1, STEPS + 1))
    gaps = [abs(bf16[s] - fp32[s]) / fp32[s] for s in range(1, STEPS + 1)]
    assert max(gaps) > 1e-4 and max(gaps) < 5e-2, gaps
    weights = torch.load(run_dir / "weights" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert {v.dtype for v in weights.values()} == {torch.float32}


def test_zero3_weights_are_gathered_module_by_module_with_the_users_keys(runs, tmp_path):
    """weights/last.pt of a ZeRO-3 run holds the plain model's keys (no engine or compile prefix) and gives the run's
    own test loss in eval.py on one process; the gather takes one module's parameters at a time."""
    weights = torch.load(runs["zero3"] / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert list(weights["model"]) == list(LeNet((1, 28, 28), 10).state_dict())
    out = _eval(tmp_path, [f"ckpt_path={runs['zero3'] / 'weights' / 'last.pt'}", "strategy=single"])
    result = json.loads((runs["zero3"] / "result.json").read_text())
    assert f"test loss {result['test_loss']:.4f}" in out

    # the mechanism, in this process: a model with a tied head, each module's own parameters gathered in turn
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.body, self.head = nn.Embedding(5, 4), nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), \
                nn.Linear(4, 5, bias=False)
            self.head.weight = self.embed.weight

    model, held = Tied(), []

    class Gathered:
        def __init__(self, params):
            self.params = params

        def __enter__(self):
            held.append(len(self.params))

        def __exit__(self, *exc):
            pass

    state = state_module_by_module(model, Gathered, keep=True)
    assert list(state) == list(model.state_dict()) and all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert max(held) <= 2, "one module's own parameters at a time"
    assert state_module_by_module(model, Gathered, keep=False) is None


def test_eval_py_refuses_a_zero_checkpoint_of_another_world_size_in_the_driver(runs, tmp_path):
    folder = runs["zero2"] / "checkpoints" / "step-00000012"
    proc = _eval_proc(tmp_path, [f"ckpt_path={folder}", "strategy=deepspeed", "strategy.zero_stage=2",
                                 "strategy.nproc_per_node=1"])
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (f"ckpt_path={folder} is not allowed with 1 worker(s)" in proc.stderr
            and "holds deepspeed-zero2 shards of 2 workers" in proc.stderr and "weights/*.pt" in proc.stderr), proc.stderr
    assert "worker_logs" not in proc.stderr and not list(tmp_path.rglob("worker_logs")), "refused before any worker"


def _eval_proc(cwd, args):
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, str(REPO / "eval.py"), *pin_accelerator(args)], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _eval(cwd, args) -> str:
    return check_ok(_eval_proc(cwd, args))


def _every_gpu_args(gpus: int, stage: int, precision: str) -> list[str]:
    """STEPS steps of 64 samples per GPU in 2 micro-batches, all in epoch 1 whatever the number of GPUs."""
    batch = 64 * gpus
    return ["strategy=deepspeed", f"strategy.zero_stage={stage}", f"trainer.precision={precision}",
            "trainer.grad_accum=2", "trainer.grad_clip=1.0", f"trainer.batch_size={batch}",
            f"dataset.max_train_samples={batch * STEPS}",
            *(a for a in COMMON if not a.startswith(("trainer.batch_size=", "dataset.max_train_samples=")))]


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 5, 8])
def test_the_every_gpu_run_has_its_steps_on_any_number_of_gpus(gpus):
    """The GPU test below, checked here for the machines it may run on: its data holds STEPS steps in one epoch."""
    args = dict(a.split("=", 1) for a in _every_gpu_args(gpus, 2, "bf16"))
    batch, samples = int(args["trainer.batch_size"]), int(args["dataset.max_train_samples"])
    assert int(args["trainer.max_steps"]) == STEPS and samples // batch == STEPS and batch % (gpus * 2) == 0


@needs_gpu
@pytest.mark.parametrize("stage", [2, 3])
def test_cuda_bf16_zero_trains_on_every_gpu_with_nccl(tmp_path, stage):
    if not torch.cuda.is_bf16_supported(including_emulation=False):  # and fp16 is refused with ZeRO 1-3
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16")
    gpus = torch.cuda.device_count()
    out = check_ok(_run(tmp_path, _every_gpu_args(gpus, stage, "bf16")))
    assert f"{gpus} process(es) on cuda" in out
    [run_dir] = run_dirs(tmp_path)
    config = json.loads((run_dir / "deepspeed_config.json").read_text())
    assert config["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"} and config["bf16"] == {"enabled": False}
    assert config["gradient_accumulation_steps"] == 2
    assert config["gradient_clipping"] == 1.0
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1)) and losses[STEPS] < losses[1]
    scalars = read_scalars(run_dir)
    assert all(f"memory/max_allocated_gib/rank{r}" in scalars for r in range(gpus))
