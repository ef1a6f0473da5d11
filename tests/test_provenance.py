"""provenance.json: what code (the user's project and hydra-dist), command, versions, packages, machine and
environment a run ran with; a resumed run says when its code changed; no git never stops a run."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, check_ok, run_dirs, run_train
from framework.results.provenance import behaviour_env, code_changes, collect, git_state, gpus

TINY_RUN = ["strategy=single", "dataset=synthetic", "dataset.train_size=128", "dataset.test_size=64",
            "trainer.batch_size=32", "trainer.max_steps=2", "trainer.log_every_n_steps=1"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout


def project_repo(root: Path) -> Path:
    """A user's project: a git repository with a config dir and one module, committed."""
    repo = root / "project"
    (repo / "conf").mkdir(parents=True)
    (repo / "conf" / "README").write_text("the project's config groups\n")
    (repo / "mymodel.py").write_text("WIDTH = 8\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "first")
    return repo


def test_a_run_records_its_projects_code_and_a_resumed_run_says_the_code_changed(tmp_path):
    repo = project_repo(tmp_path)
    (repo / "mymodel.py").write_text("WIDTH = 16\n")  # uncommitted
    (repo / "notes.txt").write_text("untracked\n")
    cwd = tmp_path / "elsewhere"  # not a repository: the --config-dir says where the project is
    cwd.mkdir()
    args = ["--config-dir", str(repo / "conf"), *TINY_RUN]
    env = {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "1", "TORCH_HUB_TOKEN": "secret", "UNRELATED_SETTING": "1"}
    check_ok(run_train(args, cwd, env=env))
    [run_dir] = run_dirs(cwd)

    record = json.loads((run_dir / "provenance.json").read_text())
    project = record["git"]["project"]
    first_commit = git(repo, "rev-parse", "HEAD").strip()
    assert (project["repository"], project["commit"], project["dirty"]) == (str(repo), first_commit, True)
    assert project["untracked"] == ["notes.txt"]
    patch = (run_dir / project["patch"]).read_bytes()
    assert patch == git(repo, "diff", "HEAD", "--binary").encode() and b"+WIDTH = 16" in patch
    own = record["git"]["hydra-dist"]
    assert own["repository"] == str(REPO) and own["commit"] == git(REPO, "rev-parse", "HEAD").strip()
    assert "--config-dir" in record["command"]["argv"] and "trainer.max_steps=2" in record["command"]["overrides"]
    assert record["versions"]["python"] and record["versions"]["torch"] and "deepspeed" in record["versions"]
    assert record["packages"]["torch"] and record["host"]["hostname"]
    assert record["env"]["NCCL_DEBUG"] == "WARN" and record["env"]["OMP_NUM_THREADS"] == "1"
    assert "TORCH_HUB_TOKEN" not in record["env"] and "UNRELATED_SETTING" not in record["env"]

    git(repo, "commit", "-qam", "wider")  # the code changes, then the run is started again in its folder
    out = check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], cwd))
    new_commit = git(repo, "rev-parse", "HEAD").strip()
    assert (f"note: the code differs from what started {run_dir} (project ({repo}): commit {first_commit[:10]} -> "
            f"{new_commit[:10]})") in out
    assert json.loads((run_dir / "provenance.json").read_text()) == record  # the first start's record stays
    again = json.loads((run_dir / "provenance-2.json").read_text())
    assert again["git"]["project"]["commit"] == new_commit and not again["git"]["project"]["dirty"]


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
