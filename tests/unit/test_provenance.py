"""provenance.json's parts in this process: a missing git or repository, a changed commit or uncommitted change told
apart, the environment that changes torch and NCCL (and no secrets), GPUs from nvidia-smi. A run's record:
tests/runs/test_provenance.py."""
import os

import pytest

from framework.results.provenance import behaviour_env, code_changes, collect, git_state, gpus
from support.processes import REPO


def test_without_git_or_a_repository_the_record_says_so(tmp_path, monkeypatch):
    state, diff = git_state(tmp_path)
    assert state["repository"] is None and "not a git repository" in state["why"] and diff == b""
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH at all
    state, _ = git_state(REPO)
    assert state == {"repository": None, "folder": str(REPO), "why": "git is not installed"}
    record = collect(["train.py"], [], tmp_path).record
    assert record["git"]["project"]["why"] == "git is not installed"


def test_a_changed_commit_or_uncommitted_change_is_told_apart():
    def record(commit, patch):
        return {"git": {"project": {"repository": "/p", "commit": commit, "patch_sha256": patch},
                        "hydra-dist": {"repository": "/p", "same_as": "project"}}}

    assert code_changes(record("a" * 40, None), record("a" * 40, None)) == []
    assert code_changes(record("a" * 40, None), record("b" * 40, None)) == [
        "project (/p): commit aaaaaaaaaa -> bbbbbbbbbb"]
    assert code_changes(record("a" * 40, None), record("a" * 40, "f00")) == ["project (/p): other uncommitted changes"]


def test_behaviour_env_keeps_what_changes_torch_and_nccl_and_no_secrets(monkeypatch):
    for name, value in {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0", "TORCHINDUCTOR_CACHE_DIR": "/c",
                        "MASTER_PORT": "29500", "NCCL_SECRET_KEY": "x", "HOME_DIR": "/h"}.items():
        monkeypatch.setenv(name, value)
    env = behaviour_env()
    assert {k: env.get(k) for k in ("CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "TORCHINDUCTOR_CACHE_DIR",
                                    "MASTER_PORT")} == {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_SOCKET_IFNAME": "eth0",
                                                        "TORCHINDUCTOR_CACHE_DIR": "/c", "MASTER_PORT": "29500"}
    assert "NCCL_SECRET_KEY" not in env and "HOME_DIR" not in env


def test_gpus_from_nvidia_smi_when_nvml_is_not_installed(tmp_path, monkeypatch):
    """nvidia-smi's CSV query as the record reads it (a stand-in prints what the real one prints for these fields)."""
    try:
        import pynvml  # noqa: F401
        pytest.skip("nvidia-ml-py is installed: NVML answers first")
    except ImportError:
        pass
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n[ \"$1\" = \"--query-gpu=index,name,memory.total,uuid,driver_version\" ] || exit 9\n"
                    "echo '0, NVIDIA H100 80GB HBM3, 81559, GPU-1a2b, 550.54.15'\n"
                    "echo '1, NVIDIA H100 80GB HBM3, 81559, GPU-3c4d, 550.54.15'\n"
                    "echo '2, NVIDIA A100-SXM4-40GB, [N/A], GPU-5e6f, 550.54.15'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    found = gpus()
    assert found["source"] == "nvidia-smi"
    assert found["devices"][1] == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                                   "uuid": "GPU-3c4d", "driver": "550.54.15"}
    assert found["devices"][2] == {"nvidia-smi": "2, NVIDIA A100-SXM4-40GB, [N/A], GPU-5e6f, 550.54.15"}  # kept as is
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert gpus()["devices"] == [] and "no NVIDIA driver found" in gpus()["why"]
