"""What tests/engines/test_model_parallel.py, test_model_parallel_user.py and test_inductor.py share: the run settings
(fp32, SGD with a clipping bound the gradient norm exceeds, accumulation over 2 micro-batches, a checkpoint every 4
steps), the char LM they train, the meshes, the comparison with one process at every step, and a run killed on one
mesh and resumed in its folder on another."""
from __future__ import annotations

import json
from pathlib import Path

from support.processes import check_ok, run_train
from support.run_files import losses_by_step, run_dirs

STEPS = 8
# SGD: Adam is nearly blind to a gradient's scale, so clipping would hardly show; 0.05 is below the gradient norm
# of every step. The stall watchdog names a stuck rank long before the test's own timeout.
COMMON = [f"trainer.max_steps={STEPS}", "trainer.batch_size=16", "trainer.grad_accum=2", "trainer.log_every_n_steps=1",
          "trainer.checkpoint_every_n_steps=4", "optimizer=sgd", "optimizer.lr=0.1", "trainer.grad_clip=0.05",
          "trainer.stall_timeout=120", "trainer.progress_bar=false"]
# the built-in char LM: a 4-block GPT, 32 wide, its head tied to the token embedding
CHAR_LM = ["experiment=char_lm", "model.n_layer=4", "model.n_embd=32", "model.n_head=4", "dataset.block_size=32",
           "dataset.max_train_samples=1024", "dataset.max_test_samples=64", *COMMON]
MESH = ["strategy.timeout=180"]  # longer than the stall watchdog, which then names the stalled rank
# fp32 on gloo: what differs from one process is the order of sums (TP's all-reduces, FSDP's reduce-scatter)
REL = 1e-5


def pipeline(schedule: str) -> list[str]:
    return ["strategy=pp", f"strategy.schedule={schedule}", *MESH]


def train(runs, args: list[str], env: dict | None = None, launcher: list[str] | None = None) -> Path:
    """A shared run of these settings (support/run_cache.py): its run folder."""
    return runs.train(args, env=env, launcher=launcher).ok().run_dir


def assert_same_losses(reference: dict[int, float], run_dir: Path, steps=range(1, STEPS + 1)) -> None:
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in steps:
        assert abs(got[step] - reference[step]) <= REL * abs(reference[step]), (
            f"step {step}: one process {reference[step]} vs {run_dir.name} {got[step]}")
    assert len({round(v, 6) for v in got.values()}) > 1, "the loss never changed"


def result(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def resumed_from_step_4(runs, checkpointed: Path, then: list[str], env: dict | None = None) -> tuple[Path, str]:
    """`then` (another mesh, or another strategy) resumes the step-4 checkpoint a run on one mesh wrote (its DCP
    shards), in a run folder of its own, and trains steps 5 to STEPS. Returns the run folder and its output."""
    run = runs.train([*then, f"trainer.resume={checkpointed / 'checkpoints' / 'step-00000004'}"], env=env).ok()
    assert "resumed from" in run.stdout and "step-00000004 (step 4" in run.stdout, run.stdout[-3000:]
    return run.run_dir, run.stdout


def killed_then_resumed(cwd: Path, first: list[str], then: list[str], env: dict | None = None) -> tuple[Path, str]:
    """`first` dies after step 6 (rank 0 SIGKILLed by tests/support/faults/fault_injection.py; its last checkpoint is
    step 4's), then `then` (another mesh, or another strategy) resumes in the same run folder. Returns the run folder
    and the resumed run's output."""
    cwd.mkdir(parents=True, exist_ok=True)
    killed = run_train(first, cwd, env=env, timeout=300, faults="kill_after_step:6:0")
    assert killed.returncode != 0 and "fault injection: SIGKILL" in killed.stdout + killed.stderr, (
        killed.stdout[-2000:] + killed.stderr[-2000:])
    [run_dir] = run_dirs(cwd)
    out = check_ok(run_train([*then, f"hydra.run.dir={run_dir}"], cwd, env=env, timeout=300))
    assert "resumed from" in out and "step-00000004 (step 4" in out, out[-3000:]
    return run_dir, out


def assert_continues(reference: dict[int, float], run_dir: Path) -> None:
    """A run resumed from step 4 logged steps 5 to STEPS with one process's losses."""
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(5, STEPS + 1))
    for step in got:
        assert abs(got[step] - reference[step]) <= REL * abs(reference[step]), (
            f"step {step}: one process {reference[step]} vs {run_dir.name} {got[step]}")
