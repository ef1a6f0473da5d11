"""strategy=deepspeed: ZeRO 0-3 with 2 gloo workers (DeepSpeed's cpu accelerator) trains like one process, resumes
from its own sharded checkpoints (a worker killed while writing one, a stopped run), shows ZeRO's optimizer-state
savings and each rank's wait in TensorBoard, exports whole fp32 weights gathered module by module, trains in bf16, and
joins torchrun's workers. The Adam runs are shared (support/references.py); accumulation, clipping and the other
features: tests/engines/test_rich_runs.py; the refusals of bad values: tests/unit/test_engine_options.py. The first
run on a machine builds DeepSpeed's shared-memory op (`make setup` does it beforehand)."""
import json
import shutil

import pytest
import torch
from torch import nn

from support.driver import command_in_process, driver_says
from support.marks import needs_gpu
from support.processes import assert_killed_run_resumes, check_ok, kill_in_checkpoint, run_train, torchrun
from support.references import ADAM, STEPS, adam, deepspeed_on_every_gpu
from support.run_files import losses_by_step, read_scalars, run_dirs, walk

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install '.[deepspeed]' or make setup)")

from framework.models.lenet import LeNet  # noqa: E402
from framework.strategies.deepspeed import state_module_by_module  # noqa: E402

STAGES = (0, 1, 2, 3)
DEEPSPEED = ["strategy=deepspeed", "strategy.nproc_per_node=2"]
# fp32. Each rank takes rank::2 of the single process's batch and the engine averages the two gradients, so the
# only differences are summation order (the all-reduce, or ZeRO's reduce-scatter over flattened buckets) and
# Adam run on flat partitions instead of per-tensor: about 1e-7 relative in the loss, measured.
REL = 1e-5


def zero(runs, stage: int):
    return runs.train(adam(f"zero{stage}")).ok().run_dir


@pytest.mark.parametrize("stage", [pytest.param(s, marks=pytest.mark.core) if s == 2 else s for s in STAGES])
def test_zero_stage_with_two_workers_matches_one_process(runs, stage):
    single, ds = losses_by_step(runs.train(adam("single")).ok().run_dir), losses_by_step(zero(runs, stage))
    assert sorted(single) == sorted(ds) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert abs(ds[step] - single[step]) <= REL * abs(single[step]), \
            f"step {step}: single {single[step]} vs ZeRO-{stage} {ds[step]}"
    assert single[STEPS] < single[1]
    result = json.loads((zero(runs, stage) / "result.json").read_text())
    assert result["strategy"] == "deepspeed" and result["processes"] == 2 and result["steps"] == STEPS
    assert len(result["per_rank_samples_per_sec"]) == 2 and min(result["per_rank_samples_per_sec"]) > 0


def test_run_folder_holds_the_deepspeed_config_and_sharded_checkpoints(runs):
    run_dir = zero(runs, 2)
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
    shutil.copytree(zero(runs, 2) / "checkpoints", folder)
    shard = folder / "step-00000012" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.write_bytes(shard.read_bytes()[:100])
    warnings = []
    assert newest_valid(folder, warnings.append).step == 8
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt: it is truncated" in warnings[0]


def test_zero_1_and_2_hold_less_optimizer_state_per_rank_than_zero_0(runs):
    def per_rank(stage):
        scalars = read_scalars(zero(runs, stage))
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
        scalars = read_scalars(zero(runs, stage))
        assert all(v > 0 for _, v in scalars["time/busy_ms/rank1"])
        assert ("time/wait_ms/rank0" in scalars) == (stage < 3), f"ZeRO-{stage}"


def test_worker_killed_while_writing_a_checkpoint_resumes_the_same_loss_curve(runs, tmp_path):
    """Rank 0 dies halfway through the step-8 checkpoint of ZeRO-3 (the other stages save and load through the same
    path: ZeRO-2 below); the restarted group ignores that uncommitted folder, resumes from step 4 and continues the
    uninterrupted run's loss curve. A run of its own: it is killed."""
    out = check_ok(run_train([*adam("zero3"), "strategy.max_restarts=1"], tmp_path, timeout=300,
                             env=kill_in_checkpoint(8, 0)))
    assert "fault injection: SIGKILL" in out and "(step 4, " in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == 4 and result["steps"] == STEPS
    expected, got = losses_by_step(zero(runs, 3)), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    folders = sorted(p.name for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir())
    assert folders == ["step-00000008", "step-00000012"], "every shard folder left is a committed checkpoint"
    assert all((run_dir / "checkpoints" / f"{name}.json").is_file() for name in folders)


def test_a_stopped_run_resumes_with_resume_auto(runs, tmp_path):
    """A worker dies (no restarts): the run fails; the same command with hydra.run.dir picks it up."""
    assert_killed_run_resumes(tmp_path, adam("zero2"), "kill_after_step:10:1", zero(runs, 2), STEPS, resumed_from=8)


def test_a_deepspeed_checkpoint_is_not_resumed_by_another_stage_or_strategy(runs, tmp_path):
    for args in (["strategy=deepspeed", "strategy.zero_stage=3"], ["strategy=ddp"]):
        line = driver_says([*args, *ADAM, f"trainer.resume={zero(runs, 2)}"], tmp_path)
        assert "has format deepspeed-zero2" in line, line


@pytest.mark.parametrize("workers", [1, 4])
def test_a_zero_checkpoint_is_not_resumed_on_another_world_size(runs, tmp_path, workers):
    """ZeRO partitions follow the world size that wrote them: refused in the driver, saying why and what to do."""
    line = driver_says(["strategy=deepspeed", "strategy.zero_stage=2", f"strategy.nproc_per_node={workers}", *ADAM,
                        f"trainer.resume={zero(runs, 2)}"], tmp_path)
    assert (f"is not allowed with {workers} worker(s): checkpoint" in line
            and "holds deepspeed-zero2 shards of 2 workers, and strategy=deepspeed cannot reshard them" in line
            and "Use 2 workers (e.g. strategy.nproc_per_node=2 on one node)" in line), line


def test_eval_py_refuses_a_zero_checkpoint_of_another_world_size_in_the_driver(runs, tmp_path, monkeypatch, capsys):
    """eval.py's own composition and checks, in this process: exit 2, one line, before any worker."""
    folder = zero(runs, 2) / "checkpoints" / "step-00000012"
    code, _, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={folder}", "strategy=deepspeed",
                                                    "strategy.zero_stage=2", "strategy.nproc_per_node=1"],
                                      tmp_path, monkeypatch, capsys)
    assert code == 2 and "Traceback" not in err, err
    [line] = err.splitlines()
    assert (f"ckpt_path={folder} is not allowed with 1 worker(s)" in line
            and "holds deepspeed-zero2 shards of 2 workers" in line and "weights/*.pt" in line), line
    assert not walk(tmp_path, "worker_logs"), "refused before any worker"


def test_under_torchrun_deepspeed_uses_the_started_workers(tmp_path):
    """A run of its own: its launcher is the subject."""
    out = check_ok(run_train(["strategy=deepspeed", "strategy.zero_stage=1", *ADAM], tmp_path, launcher=torchrun()))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "deepspeed" and result["processes"] == 2 and result["steps"] == STEPS
    assert (run_dir / "deepspeed_config.json").is_file() and (run_dir / "checkpoints" / "step-00000012.json").is_file()


def test_bf16_trains_in_bf16_with_fp32_weights_and_evaluates_the_same_way(runs):
    """ZeRO-2, 2 gloo workers, trainer.precision=bf16: the engine computes in bf16 (the loss curve leaves the fp32
    run's by more than summation order, and stays near it), the weights it exports are fp32."""
    run_dir = runs.train([*adam("zero2"), "trainer.precision=bf16"]).ok().run_dir
    bf16, fp32 = losses_by_step(run_dir), losses_by_step(zero(runs, 2))
    assert sorted(bf16) == list(range(1, STEPS + 1))
    gaps = [abs(bf16[s] - fp32[s]) / fp32[s] for s in range(1, STEPS + 1)]
    assert max(gaps) > 1e-4 and max(gaps) < 5e-2, gaps
    weights = torch.load(run_dir / "weights" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert {v.dtype for v in weights.values()} == {torch.float32}


def test_zero3_weights_are_gathered_module_by_module_with_the_users_keys(runs, tmp_path, monkeypatch, capsys):
    """weights/last.pt of a ZeRO-3 run holds the plain model's keys (no engine or compile prefix) and gives the run's
    own test loss in eval.py on one process (its command in this process: the weights are the subject); the gather
    takes one module's parameters at a time."""
    weights = torch.load(zero(runs, 3) / "weights" / "last.pt", map_location="cpu", weights_only=True)
    assert list(weights["model"]) == list(LeNet((1, 28, 28), 10).state_dict())
    code, out, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={zero(runs, 3) / 'weights' / 'last.pt'}",
                                                      "strategy=single"], tmp_path, monkeypatch, capsys)
    assert code == 0, out + err
    result = json.loads((zero(runs, 3) / "result.json").read_text())
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


@needs_gpu
@pytest.mark.parametrize("stage", [2, 3])
def test_cuda_bf16_zero_trains_on_every_gpu_with_nccl(tmp_path, stage):
    if not torch.cuda.is_bf16_supported(including_emulation=False):  # and fp16 is refused with ZeRO 1-3
        pytest.skip(f"{torch.cuda.get_device_name()} has no bf16")
    gpus = torch.cuda.device_count()
    out = check_ok(run_train(deepspeed_on_every_gpu(gpus, stage, "bf16"), tmp_path, timeout=300))
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
