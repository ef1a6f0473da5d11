"""Multi-node through the elastic agent's c10d rendezvous: two 'nodes' (two train.py) on this machine."""
import json
import os
import subprocess
import sys

import pytest

from support.processes import TINY, TRAIN, free_port, pin_accelerator, run_together
from support.run_files import run_dirs


@pytest.mark.core
def test_two_nodes_rendezvous_and_train_as_one_job(tmp_path):
    args = ["strategy=ddp", "strategy.nnodes=2", "strategy.nproc_per_node=1",
            f"strategy.rdzv_endpoint=127.0.0.1:{free_port()}", "strategy.run_id=two-nodes", *TINY, "trainer.epochs=1"]
    command = [sys.executable, str(TRAIN), *pin_accelerator(args)]
    for name in ("node_a", "node_b"):
        (tmp_path / name).mkdir()
    nodes = run_together([(command, dict(os.environ)), (command, dict(os.environ))], tmp_path, timeout=240,
                         stderr=subprocess.STDOUT, cwds=[tmp_path / "node_a", tmp_path / "node_b"])
    outputs = [p.stdout for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    results = [json.loads((d / "result.json").read_text()) for n in ("node_a", "node_b")
               for d in run_dirs(tmp_path / n) if (d / "result.json").exists()]
    assert len(results) == 1, "exactly one node holds rank 0 and writes the result"
    assert results[0]["processes"] == 2 and len(results[0]["per_rank_samples_per_sec"]) == 2
    assert sum("rank 0's node reports the result" in out for out in outputs) == 1
