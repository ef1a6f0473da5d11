"""Two train.py started at the same moment in the same folder never share a run folder or a rendezvous port."""
import json
import os
import subprocess
import sys

from support.processes import TINY, TRAIN, pin_accelerator, run_together
from support.run_files import run_dirs


def test_two_ddp_runs_at_once_get_their_own_folders_and_ports(tmp_path):
    command = [sys.executable, str(TRAIN),
               *pin_accelerator(["strategy=ddp", "strategy.nproc_per_node=2", *TINY, "trainer.max_steps=6"])]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = run_together([(command, env), (command, env)], tmp_path, timeout=300, stderr=subprocess.STDOUT)
    assert [p.returncode for p in procs] == [0, 0], [p.stdout for p in procs]
    folders = run_dirs(tmp_path)
    assert len(folders) == 2
    for folder in folders:
        result = json.loads((folder / "result.json").read_text())
        assert result["processes"] == 2 and result["steps"] == 6
        assert len(list(folder.glob("events.out.tfevents*"))) == 1
