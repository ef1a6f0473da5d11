"""`python -m framework.devices` (also the `hydra-dist-devices` command): a real subprocess that lists what the
machine has and what each strategy would start on it; with a GPU, the NVML columns and the TensorBoard gpu/ tags."""
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, TINY, check_ok, read_scalars, run_dirs, run_train, needs_gpu


def _devices(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.devices", *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


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


def test_strategies_come_from_the_config_group_including_a_users_config_dir():
    """The list is the strategy group's entries (fsdp is one yaml in conf/strategy/), and a user's --config-dir
    adds theirs, described by their own class."""
    project = REPO / "examples" / "my_project"
    proc = subprocess.run([sys.executable, "-m", "framework.devices", "--config-dir", str(project / "conf"),
                           "trainer.accelerator=cpu"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{project}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    out = check_ok(proc)
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


@needs_gpu
def test_gpu_listing_and_nvml_metrics_in_tensorboard(tmp_path):
    pytest.importorskip("pynvml", reason="NVML readings need nvidia-ml-py (pip install 'hydra-dist[nvml]')")
    out = check_ok(_devices())
    assert f"GPUs: {torch.cuda.device_count()} visible" in out and "utilization" in out
    assert torch.cuda.get_device_name(0) in out and "NVIDIA driver " in out and "CUDA driver API " in out
    assert "utilization needs NVML" not in out
    check_ok(run_train(["strategy=single", "trainer.accelerator=gpu", *TINY], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for i in range(torch.cuda.device_count()):
        util, mem = scalars[f"gpu/util_percent/gpu{i}"], scalars[f"gpu/mem_used_gib/gpu{i}"]
        assert len(util) == len(mem) == len(scalars["loss/train"]), "one reading per log interval"
        assert all(0 <= v <= 100 for _, v in util)
    assert max(v for _, v in scalars["gpu/mem_used_gib/gpu0"]) > 0.0  # this run's own CUDA context at least
