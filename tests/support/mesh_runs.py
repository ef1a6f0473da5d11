"""What tests/engines/test_model_parallel.py and test_model_parallel_user.py share: the run settings (fp32, SGD with a
clipping bound the gradient norm exceeds, accumulation over 2 micro-batches, a checkpoint every 4 steps), the
meshes, the comparison with one process at every step, and a resume from another mesh's checkpoint."""
from __future__ import annotations

import json
from pathlib import Path

from support.run_files import losses_by_step

STEPS = 8
# SGD: Adam is nearly blind to a gradient's scale, so clipping would hardly show; 0.05 is below the gradient norm
# of every step. The stall watchdog names a stuck rank long before the test's own timeout.
COMMON = [f"trainer.max_steps={STEPS}", "trainer.batch_size=16", "trainer.grad_accum=2", "trainer.log_every_n_steps=1",
          "trainer.checkpoint_every_n_steps=4", "optimizer=sgd", "optimizer.lr=0.1", "trainer.grad_clip=0.05",
          "trainer.stall_timeout=120", "trainer.progress_bar=false"]
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


def assert_continues(reference: dict[int, float], run_dir: Path) -> None:
    """A run resumed from step 4 logged steps 5 to STEPS with one process's losses."""
    got = losses_by_step(run_dir)
    assert sorted(got) == list(range(5, STEPS + 1))
    for step in got:
        assert abs(got[step] - reference[step]) <= REL * abs(reference[step]), (
            f"step {step}: one process {reference[step]} vs {run_dir.name} {got[step]}")
