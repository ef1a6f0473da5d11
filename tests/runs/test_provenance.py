"""provenance.json of a real run: what code (the user's project and hydra-dist), command, versions, packages, machine
and environment it ran with; a resumed run says when its code changed. The parts in-process: tests/unit/test_provenance.py."""
import json
import subprocess
from pathlib import Path

from support.processes import REPO, check_ok, run_train
from support.run_files import run_dirs

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
