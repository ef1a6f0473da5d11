"""`pip install .` gives the `hydra-dist` command, with conf/ inside the package: a real wheel is built with pip,
installed into a folder of its own, and run from a directory outside the repository, importing nothing from it.
train.py's own --cfg and shell completion, in-process: tests/unit/test_cli.py."""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.processes import REPO, TINY, check_ok, pin_accelerator
from support.run_files import run_dirs

CONF_FILES = sorted(str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout (so the build leaves nothing in it), installed with --target."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "outputs", "multirun", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".whl"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    check_ok(subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"), str(source)],
                            capture_output=True, text=True, timeout=300))
    [wheel] = (work / "dist").glob("hydra_dist-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    assert {f"framework/conf/{f}" for f in CONF_FILES} <= names, "every conf yaml ships in the wheel"
    assert "framework/cli.py" in names and "framework/training/trainer.py" in names
    assert "hydra_plugins/hydra_dist_sweepers/resumable_optuna.py" in names  # Hydra finds plugins only there
    assert "hydra_plugins/__init__.py" not in names  # a namespace shared with every other Hydra plugin
    assert "hydra-dist = framework.cli:main" in scripts and "hydra-dist-devices = framework.devices:main" in scripts
    assert "hydra-dist-sample = framework.cli:sample_main" in scripts
    assert "hydra-dist-verify = framework.cli:verify_main" in scripts
    target = work / "site"
    check_ok(subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                            capture_output=True, text=True, timeout=300))
    return target


def _command(installed: Path, name: str, args: list[str], cwd: Path, env: dict | None = None, timeout: int = 240):
    """An installed console script, with only the install folder added to the import path."""
    full_env = {**os.environ, "PYTHONPATH": str(installed), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([str(installed / "bin" / name), *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def test_installed_command_composes_from_the_packaged_conf(installed, tmp_path):
    out = check_ok(_command(installed, "hydra-dist", ["--cfg", "job", "strategy=ddp", "model=simple_cnn"], tmp_path))
    assert "_target_: framework.models.simple_cnn.SimpleCNN" in out and "name: ddp" in out
    paths = check_ok(_command(installed, "hydra-dist", ["--info", "searchpath"], tmp_path))
    assert f"file://{installed / 'framework' / 'conf'}" in paths and str(REPO) not in paths
    imported = subprocess.run(
        [sys.executable, "-c", "import framework.cli, framework.common.paths; print(framework.cli.__file__, framework.common.paths.CONF_DIR)"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(installed)}, capture_output=True, text=True)
    assert check_ok(imported).split() == [str(installed / "framework" / "cli.py"), str(installed / "framework" / "conf")]
    assert "Configuration groups" in check_ok(_command(installed, "hydra-dist", ["--help"], tmp_path))
    assert not (tmp_path / "outputs").exists(), "--cfg, --info and --help start no run"
    sampled = _command(installed, "hydra-dist-sample", [], tmp_path)
    assert sampled.returncode == 2 and sampled.stderr.strip().startswith("error: ckpt_path is missing"), sampled.stderr
    assert not list(tmp_path.iterdir()), "sample.py writes nothing"
    verified = _command(installed, "hydra-dist-verify", ["strategy=single"], tmp_path)
    assert verified.returncode == 2 and verified.stderr.strip().startswith(
        "error: strategy=single is not allowed with verify.py"), verified.stderr


def test_installed_command_trains_ddp_from_outside_the_repo(installed, tmp_path):
    out = check_ok(_command(installed, "hydra-dist", pin_accelerator(["strategy=ddp", "strategy.nproc_per_node=2", *TINY,
                                                             "trainer.max_steps=8"]), tmp_path))
    assert "done: test accuracy" in out
    [run_dir] = run_dirs(tmp_path)
    assert (run_dir / "result.json").exists() and (run_dir / "train.log").exists()
    assert not (run_dir / "cli.log").exists(), "the Hydra job is called train whichever command started it"


def test_installed_devices_command(installed, tmp_path):
    out = check_ok(_command(installed, "hydra-dist-devices", ["trainer.accelerator=cpu"], tmp_path))
    assert "What each strategy would start here:" in out and "strategy=ddp" in out


def test_shell_completion_for_both_commands(installed, tmp_path):
    script = check_ok(_command(installed, "hydra-dist", ["-sc", "install=bash"], tmp_path))
    assert "hydra_bash_completion" in script and script.rstrip().endswith("hydra-dist")
    # what bash asks when the user presses TAB after `hydra-dist strategy=`
    answer = check_ok(_command(installed, "hydra-dist", ["-sc", "query=bash"], tmp_path,
                               env={"COMP_LINE": "hydra-dist strategy=", "COMP_POINT": "20"}))
    assert {"strategy=ddp", "strategy=dp", "strategy=single", "strategy=auto"} <= set(answer.split())
