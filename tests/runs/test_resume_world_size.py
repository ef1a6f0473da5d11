"""A run checkpointed by 2 ddp workers resumes on 1 or 3 workers (single, ddp), with another grad_accum or global
batch: the loss curve continues, and no sample of the interrupted epoch is trained twice or skipped (the probe
model records every training micro-batch's sample indices, per rank). framework/checkpoints/position.py has the
reasoning. Real processes; the interruption is a real SIGKILL of rank 0 after step 10 (last checkpoint: step 8)."""
import json
import math
import shutil
import textwrap
from pathlib import Path

import pytest

from support.processes import REPO, check_ok, run_train, user_code_env
from support.run_files import losses_by_step, run_dirs

SAMPLES, BATCH, EPOCHS = 480, 24, 2  # 20 steps per epoch; 24 splits over 1, 2 and 3 workers
STEPS = EPOCHS * SAMPLES // BATCH
SAVED_STEP = 8  # checkpoints every 4 steps; rank 0 dies after step 10
COMMON = ["dataset=indexed_blobs", "model=index_recorder", "optimizer=sgd", "optimizer.lr=0.05",
          f"trainer.epochs={EPOCHS}", f"trainer.batch_size={BATCH}", "trainer.log_every_n_steps=1",
          "trainer.checkpoint_every_n_steps=4"]
CONF = {
    "dataset/indexed_blobs.yaml": f"""
        name: indexed_blobs
        train: {{_target_: resume_probe.IndexedBlobs, size: {SAMPLES}, train: true}}
        test: {{_target_: resume_probe.IndexedBlobs, size: 96, train: false}}
    """,
    "model/index_recorder.yaml": "_target_: resume_probe.IndexRecorder\n",
}
RESUMES = {  # name: overrides of the resumed run
    "single": ["strategy=single"],
    "ddp1_dataloader": ["strategy=ddp", "strategy.nproc_per_node=1", "dataset.in_memory=false"],
    "ddp3_accum2": ["strategy=ddp", "strategy.nproc_per_node=3", "trainer.grad_accum=2"],
    "single_batch48": ["strategy=single", "trainer.batch_size=48"],
}


@pytest.fixture(scope="module")
def conf_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe_conf")
    for name, text in CONF.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def _run(conf_dir, cwd: Path, args: list[str], probe: Path | None = None, fault: str | None = None):
    cwd.mkdir(parents=True, exist_ok=True)
    env = user_code_env(REPO)
    if probe:
        probe.mkdir(parents=True, exist_ok=True)
        env["RESUME_PROBE_DIR"] = str(probe)
    return run_train(["--config-dir", str(conf_dir), *COMMON, *args], cwd, env=env, timeout=300, faults=fault)


def _records(probe: Path) -> dict[int, list[list[int]]]:
    """Per rank, the sample indices of each training micro-batch, in order."""
    return {int(p.stem.removeprefix("rank")): [[int(i) for i in line.split()] for line in p.read_text().splitlines()]
            for p in sorted(probe.glob("rank*.txt"))}


@pytest.fixture(scope="module")
def ddp2_runs(conf_dir, tmp_path_factory):
    """The uninterrupted 2-worker run (reference curve) and the interrupted one (its run folder and probe)."""
    root = tmp_path_factory.mktemp("world_size")
    check_ok(_run(conf_dir, root / "reference", ["strategy=ddp", "strategy.nproc_per_node=2"]))
    [reference] = run_dirs(root / "reference")
    killed = _run(conf_dir, root / "killed", ["strategy=ddp", "strategy.nproc_per_node=2"], probe=root / "probe_killed",
                  fault="kill_after_step:10:0")
    assert killed.returncode != 0 and "fault injection: SIGKILL" in killed.stdout + killed.stderr
    [interrupted] = run_dirs(root / "killed")
    manifest = json.loads((interrupted / "checkpoints" / f"step-{SAVED_STEP:08d}.json").read_text())
    assert manifest["world_size"] == 2 and manifest["samples_in_epoch"] == SAVED_STEP * BATCH
    return {"root": root, "reference": losses_by_step(reference), "interrupted": interrupted,
            "probe": root / "probe_killed", "resumed": {}}


def _resume(conf_dir, ddp2_runs, name: str):
    """Resume a copy of the interrupted run folder with RESUMES[name]; cached per module."""
    if name not in ddp2_runs["resumed"]:
        cwd = ddp2_runs["root"] / name
        run_dir = cwd / "run"
        shutil.copytree(ddp2_runs["interrupted"], run_dir)
        proc = _run(conf_dir, cwd, [*RESUMES[name], f"hydra.run.dir={run_dir}"], probe=cwd / "probe")
        out = check_ok(proc)
        ddp2_runs["resumed"][name] = (out, run_dir, json.loads((run_dir / "result.json").read_text()), cwd / "probe")
    return ddp2_runs["resumed"][name]


def _epoch_samples(ddp2_runs, probe: Path, resumed_steps_in_epoch0: int, accum: int) -> tuple[list[int], list[int]]:
    """Samples trained in epoch 1 (the interrupted one: the first run's steps up to the checkpoint, then the resumed
    run's) and in epoch 2 (the resumed run's), each as one sorted list over all ranks."""
    first = [i for batches in _records(ddp2_runs["probe"]).values() for b in batches[:SAVED_STEP] for i in b]
    epoch1, epoch2 = list(first), []
    for batches in _records(probe).values():
        cut = resumed_steps_in_epoch0 * accum
        epoch1 += [i for b in batches[:cut] for i in b]
        epoch2 += [i for b in batches[cut:] for i in b]
    return sorted(epoch1), sorted(epoch2)


@pytest.mark.parametrize("name,workers,accum", [("single", 1, 1), ("ddp1_dataloader", 1, 1), ("ddp3_accum2", 3, 2)])
def test_resumed_on_another_world_size_the_curve_continues_and_every_sample_is_trained_once(
        conf_dir, ddp2_runs, name, workers, accum):
    out, run_dir, result, probe = _resume(conf_dir, ddp2_runs, name)
    assert f"(step {SAVED_STEP}, epoch 1); saved by 2 worker(s), continuing on {workers}" in out
    assert result["resumed_from_step"] == SAVED_STEP and result["steps"] == STEPS and result["processes"] == workers
    losses = losses_by_step(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    # Same global batch, same samples per step, global model and optimizer state: the maths is the 2-worker run's;
    # only the order of float sums differs (the gradient averaged over 1, 2 or 3 ranks)
    for step in range(SAVED_STEP + 1, STEPS + 1):
        assert math.isfinite(losses[step])
        assert losses[step] == pytest.approx(ddp2_runs["reference"][step], rel=1e-5), f"step {step}"
    epoch1, epoch2 = _epoch_samples(ddp2_runs, probe, SAMPLES // BATCH - SAVED_STEP, accum)
    assert epoch1 == list(range(SAMPLES)), "the interrupted epoch: every sample once, none twice, none skipped"
    assert epoch2 == list(range(SAMPLES))


def test_one_worker_resumes_bit_for_bit_alike_under_single_and_ddp(conf_dir, ddp2_runs):
    """One process with the whole batch: single and ddp (1 worker, DataLoader path) do the same float operations."""
    single = losses_by_step(_resume(conf_dir, ddp2_runs, "single")[1])
    ddp1 = losses_by_step(_resume(conf_dir, ddp2_runs, "ddp1_dataloader")[1])
    resumed = range(SAVED_STEP + 1, STEPS + 1)
    assert [single[s] for s in resumed] == [ddp1[s] for s in resumed]


def test_a_new_global_batch_continues_the_epoch_in_samples(conf_dir, ddp2_runs):
    out, run_dir, result, probe = _resume(conf_dir, ddp2_runs, "single_batch48")
    # 8 steps of 24 = 192 samples = 4 steps of 48; the run is then at step 4 of 10 per epoch
    assert "global batch 24 -> 48: epoch 1 continues after its first 192 samples" in out
    assert result["steps"] == EPOCHS * SAMPLES // 48
    assert sorted(losses_by_step(run_dir))[-1] == result["steps"]
    epoch1, epoch2 = _epoch_samples(ddp2_runs, probe, SAMPLES // 48 - 4, 1)
    assert epoch1 == list(range(SAMPLES)) and epoch2 == list(range(SAMPLES))


def test_a_batch_that_splits_the_saved_position_is_refused_in_the_driver(conf_dir, ddp2_runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(ddp2_runs["interrupted"], run_dir)
    proc = _run(conf_dir, tmp_path, ["strategy=ddp", "strategy.nproc_per_node=2", "trainer.batch_size=40",
                                     f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert ("trainer.batch_size=40 is not allowed when resuming from" in proc.stderr
            and "stopped after 192 samples of epoch 1, which is not a whole number of batches of 40" in proc.stderr)
    assert "training " not in proc.stdout, "refused before any worker started"
