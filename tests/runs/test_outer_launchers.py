"""Launchers that pass `--local-rank=N` / `--local_rank=N` to the script: the tutorials'
`python -m torch.distributed.launch` without --use_env, and DeepSpeed's own `deepspeed` launcher. Like under
torchrun: the workers they started are used, one run folder, rank 0 reports, a bad value ends every rank. The
launcher is each test's subject; how `--local-rank` is read, in-process: tests/unit/test_launchers.py."""
import json
import sys
from pathlib import Path

import pytest

from support.processes import TINY, check_ok, free_port, root_cause_exit_code, run_train
from support.run_files import read_scalars, run_dirs, walk


def _torch_launch():  # no --use_env; a port of its own, not the launcher's default 29500 another run may hold
    return [sys.executable, "-m", "torch.distributed.launch", "--nproc_per_node=2", f"--master_port={free_port()}"]


def _deepspeed():
    return [str(Path(sys.executable).with_name("deepspeed")), "--num_gpus", "2", "--master_port", str(free_port())]


DS_CPU = {"DS_ACCELERATOR": "cpu"}


def _one_run(tmp_path, ranks=2):
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == ranks and len(result["per_rank_samples_per_sec"]) == ranks
    scalars = read_scalars(run_dir)
    assert all(f"throughput/samples_per_sec/rank{r}" in scalars for r in range(ranks))
    return result


@pytest.mark.core
def test_torch_distributed_launch_without_use_env(tmp_path):
    out = check_ok(run_train(["strategy=ddp", *TINY, "trainer.epochs=1"], tmp_path, launcher=_torch_launch()))
    assert out.count("done: test accuracy") == 1
    _one_run(tmp_path)


def _deepspeed_launcher():
    pytest.importorskip("deepspeed")
    if not Path(_deepspeed()[0]).exists():
        pytest.skip("DeepSpeed's launcher script is not installed next to this python")


@pytest.mark.core
def test_deepspeeds_own_launcher(tmp_path):
    _deepspeed_launcher()
    out = check_ok(run_train(["strategy=deepspeed", "strategy.zero_stage=2", *TINY, "trainer.epochs=1"], tmp_path,
                             launcher=_deepspeed(), env=DS_CPU, timeout=300))
    assert out.count("done: test accuracy") == 1
    assert _one_run(tmp_path)["strategy"] == "deepspeed"


@pytest.mark.parametrize("launcher", ["torch.distributed.launch", "deepspeed"])
def test_a_bad_value_under_the_launcher_ends_every_rank_with_one_message(tmp_path, launcher):
    if launcher == "deepspeed":
        _deepspeed_launcher()
    command, env = (_torch_launch(), {}) if launcher != "deepspeed" else (_deepspeed(), DS_CPU)
    strategy = "strategy=deepspeed" if launcher == "deepspeed" else "strategy=ddp"
    proc = run_train([strategy, "trainer.batch_size=0"], tmp_path, launcher=command, env=env, timeout=180)
    output = proc.stderr + proc.stdout
    if launcher == "deepspeed":  # its launcher ends with its first failed rank's code
        assert proc.returncode == 2 and "exits with return code = 2" in output, output
    else:  # torch's agent: its own code, and each rank's in its failure table
        assert proc.returncode == 1 and root_cause_exit_code(output) == 2, output
    assert output.count("error: trainer.batch_size=0 is not allowed: expected an integer >= 1") == 1, output
    # the launcher itself may print its ChildFailedError traceback, as it does for torchrun; ours print none
    assert "framework/run.py" not in proc.stderr and "framework/cli.py" not in proc.stderr
    assert not walk(tmp_path, "checkpoints")
