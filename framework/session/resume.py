"""The command that continues a stopped run (its folder, trainer.resume=auto) or a stopped sweep (the command that
started it, into its folder), built only by the situation that prints it."""
from __future__ import annotations

import json
import shlex
from pathlib import Path

# The record of how a run or sweep started, written into its folder by framework/results/provenance.py; a sweep's
# resume command is read back from it (a submitit task's own argv is submitit's, not the user's).
PROVENANCE_FILE = "provenance.json"


def run_resume_command(job) -> str:
    """A single run: the same config (the command's own --config-dir/--config-name, the job's overrides) into the
    same folder, from its last checkpoint. `job`: situations.Job."""
    kept = [o for o in job.overrides if not o.startswith(("hydra.run.dir=", "trainer.resume="))]
    return shlex.join(["python", "train.py", *job.config_options, *kept, f"hydra.run.dir={job.run_dir}",
                       "trainer.resume=auto"])


def sweep_resume_command(sweep_dir: Path, argv: list[str]) -> str:
    """The command that continues the sweep: the one that started it (the sweep's provenance.json keeps it; else
    argv), into its folder."""
    try:
        argv = json.loads((sweep_dir / PROVENANCE_FILE).read_text())["command"]["argv"]
    except (OSError, ValueError, KeyError):
        pass
    script = argv[0] if argv else "train.py"
    program = ["hydra-dist"] if Path(script).name == "hydra-dist" else ["python", script]
    kept = [a for a in argv[1:] if not a.startswith("hydra.sweep.dir=")]
    return shlex.join([*program, *kept, f"hydra.sweep.dir={sweep_dir}"])
