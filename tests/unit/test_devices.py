"""`python -m framework.devices` (also the `hydra-dist-devices` command, run installed by tests/runs/test_packaging.py):
its main in this process lists what the machine has and what each strategy would start on it. With a GPU, the NVML
columns and the TensorBoard gpu/ tags of a run: tests/runs/test_devices.py."""
import os
import sys
from types import SimpleNamespace

import pytest
import torch

from support.processes import REPO, check_ok


def _devices(*overrides: str) -> SimpleNamespace:
    """framework.devices' main as `python -m framework.devices <overrides>` runs it, in this process."""
    import contextlib
    import io

    from framework import devices

    out, err, code = io.StringIO(), io.StringIO(), 0
    argv = sys.argv
    sys.argv = ["framework.devices", *overrides]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            devices.main()
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else 1
    finally:
        sys.argv = argv
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without GPUs")
def test_listing_without_gpus_shows_cpu_facts_and_the_strategy_plan():
    out = check_ok(_devices())
    assert "GPUs: none visible" in out
    cores = len(os.sched_getaffinity(0))
    assert "CPU: " in out and f"| {cores} core(s) usable by this process (of {os.cpu_count()})" in out
    assert "GiB total" in out and "GiB available" in out
    assert "strategy=auto    chose single (at most one GPU): 1 process(es) on the CPU" in out
    assert "strategy=single  1 process(es) on the CPU" in out
    assert "strategy=dp      1 process on the CPU (no GPU in use" in out
    assert "strategy=ddp     2 process(es) (1 node(s) x 2) on the CPU" in out and "backend gloo" in out


def test_strategies_come_from_the_config_group_including_a_users_config_dir(monkeypatch):
    """The list is the strategy group's entries (fsdp is one yaml in conf/strategy/), and a user's --config-dir
    adds theirs, described by their own class."""
    project = REPO / "examples" / "my_project"
    monkeypatch.syspath_prepend(str(project))
    out = check_ok(_devices("--config-dir", str(project / "conf"), "trainer.accelerator=cpu"))
    assert "strategy=fsdp    2 process(es) (1 node(s) x 2) on the CPU" in out and "sharded by fully_shard" in out
    assert "strategy=announcing_ddp 2 process(es) (1 node(s) x 2) on the CPU" in out
    bad = _devices("--config-dir", str(project / "no_such_conf"))
    assert bad.returncode != 0 and "--config-dir=" in bad.stderr and "no such folder" in bad.stderr


def test_plan_follows_overrides_and_bad_overrides_fail_cleanly():
    out = check_ok(_devices("strategy=ddp", "strategy.nproc_per_node=3", "trainer.accelerator=cpu"))
    [ddp] = [line for line in out.splitlines() if line.strip().startswith("strategy=")]
    assert "strategy=ddp     3 process(es) (1 node(s) x 3) on the CPU" in ddp and "backend gloo" in ddp
    refused = check_ok(_devices("strategy=ddp", "strategy.backend=nccl", "trainer.accelerator=cpu"))
    assert "strategy=ddp     not usable here: strategy.backend=nccl is not allowed without GPUs" in refused
    bad = _devices("trainer.no_such_key=1")
    assert bad.returncode != 0 and "error: Could not override 'trainer.no_such_key'" in bad.stderr
    assert "Traceback" not in bad.stderr
