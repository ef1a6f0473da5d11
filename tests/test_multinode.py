"""Multi-node through the elastic agent's c10d rendezvous: two 'nodes' (two train.py) on this machine."""
import json
import socket
import subprocess
import sys

from conftest import TINY, TRAIN, pin_accelerator, run_dirs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_rendezvous_and_train_as_one_job(tmp_path):
    args = ["strategy=ddp", "strategy.nnodes=2", "strategy.nproc_per_node=1",
            f"strategy.rdzv_endpoint=127.0.0.1:{_free_port()}", "strategy.run_id=two-nodes", *TINY, "trainer.epochs=1"]
    nodes = []
    for name in ("node_a", "node_b"):
        (tmp_path / name).mkdir()
        nodes.append(subprocess.Popen([sys.executable, str(TRAIN), *pin_accelerator(args)], cwd=tmp_path / name,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=240)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    results = [json.loads((d / "result.json").read_text()) for n in ("node_a", "node_b")
               for d in run_dirs(tmp_path / n) if (d / "result.json").exists()]
    assert len(results) == 1, "exactly one node holds rank 0 and writes the result"
    assert results[0]["processes"] == 2 and len(results[0]["per_rank_samples_per_sec"]) == 2
    assert sum("rank 0's node reports the result" in out for out in outputs) == 1
