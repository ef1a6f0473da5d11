"""With a GPU: `python -m framework.devices` shows the NVML columns, and a run logs the TensorBoard gpu/ tags. The
listing without GPUs, in-process: tests/unit/test_devices.py."""
import subprocess
import sys

import pytest
import torch

from support.marks import needs_gpu
from support.processes import REPO, TINY, check_ok, run_train
from support.run_files import read_scalars, run_dirs


def _devices(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework.devices", *overrides], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


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
