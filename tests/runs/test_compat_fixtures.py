"""What users' run folders hold keeps working: checkpoints and a finished sweep written by the engines before the mesh
engine took over ddp and fsdp (tests/support/fixtures/, README.md there names the commit that wrote them). Each
checkpoint resumes under today's preset of the same name and continues on the uninterrupted run's losses; the sweep
run again into its folder trains nothing."""
import json
import shutil
from pathlib import Path

import pytest

from support.processes import REPO, check_ok, run_train
from support.run_files import losses_by_step

FIXTURES = REPO / "tests" / "support" / "fixtures"
CHECKPOINTS = ("ddp_powersgd", "fsdp", "tp", "pp")
STEP = 4
REL = 1e-5  # fp32 on gloo, the same world size: what may differ is the order of float sums


def checkpoint_of(fixture: Path) -> Path:
    """The step-4 checkpoint: a FILE checkpoint's .pt, else a DCP folder."""
    file = fixture / "checkpoints" / f"step-{STEP:08d}.pt"
    return file if file.exists() else fixture / "checkpoints" / f"step-{STEP:08d}"


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_a_checkpoint_written_before_resumes_onto_the_uninterrupted_losses(runs, name):
    fixture = FIXTURES / name
    args, expected = json.loads((fixture / "args.json").read_text()), json.loads((fixture / "losses.json").read_text())
    run = runs.train([*args, f"trainer.resume={checkpoint_of(fixture)}"]).ok()
    assert f"step-{STEP:08d}" in run.stdout and "resumed from" in run.stdout, run.stdout[-3000:]
    got = losses_by_step(run.run_dir)
    assert sorted(got) == sorted(map(int, expected)), f"logged steps {sorted(got)}"
    for step, loss in expected.items():
        assert abs(got[int(step)] - loss) <= REL * abs(loss), f"step {step}: before {loss}, now {got[int(step)]}"


def test_a_finished_sweep_run_again_into_its_folder_trains_nothing(tmp_path):
    """Its own run: it writes into the sweep folder (a copy of the fixture's)."""
    fixture = FIXTURES / "sweep"
    sweep_dir = tmp_path / "sweep"
    shutil.copytree(fixture / "folder", sweep_dir)
    jobs = sorted(p for p in sweep_dir.iterdir() if (p / "result.json").exists())
    results = {job: (job / "result.json").read_text() for job in jobs}
    args = json.loads((fixture / "args.json").read_text())
    out = check_ok(run_train([*args, f"hydra.sweep.dir={sweep_dir}"], tmp_path, timeout=300))
    assert len(jobs) == 2
    for number, job in enumerate(jobs):
        assert f"job {number} finished before in {job}: not trained again" in out, out[-3000:]
        assert (job / "result.json").read_text() == results[job]
        assert not (job / "checkpoints").exists()
