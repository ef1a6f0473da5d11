"""train.py's command line in this process (framework.cli's main, as `python train.py` runs it): --cfg job prints the
composed config and starts nothing; shell completion answers from the config groups. The installed commands:
tests/runs/test_packaging.py. hydra-dist-devices' and hydra-dist-plan's own arguments (overrides, --config-dir).
"""
import pytest

from framework.common.errors import ConfigError
from framework.common.paths import overrides_and_config_dir
from support.driver import command_in_process


def test_train_py_cfg_job_shows_the_composed_config(tmp_path, monkeypatch, capsys):
    code, out, _ = command_in_process("main", ["train.py", "--cfg", "job", "strategy=ddp", "trainer.batch_size=256"],
                                      tmp_path, monkeypatch, capsys)
    assert code == 0
    assert out.startswith("model:") and "strategy:\n  _target_: framework.strategies.mesh.engine.MeshStrategy\n  name: ddp\n" in out \
        and "batch_size: 256" in out
    assert "hydra:" not in out, "--cfg job leaves Hydra's own settings out"
    assert not (tmp_path / "outputs").exists()


def test_shell_completion_of_train_py(tmp_path, monkeypatch, capsys):
    """What bash asks when the user presses TAB after `python train.py model=`."""
    monkeypatch.setenv("COMP_LINE", "python train.py model=")
    monkeypatch.setenv("COMP_POINT", "22")
    code, answer, _ = command_in_process("main", ["train.py", "-sc", "query=bash"], tmp_path, monkeypatch, capsys)
    assert code == 0
    assert {"model=lenet", "model=simple_cnn"} <= set(answer.split())


def test_hydra_dist_devices_and_plan_take_overrides_and_an_existing_config_dir(tmp_path):
    assert overrides_and_config_dir(["-cd", str(tmp_path), "model=mlp"], "hydra-dist-plan") == (["model=mlp"],
                                                                                                str(tmp_path))
    with pytest.raises(ConfigError, match=r"^--config-dir=.*nope is not allowed: no such folder$"):
        overrides_and_config_dir(["--config-dir", str(tmp_path / "nope")], "hydra-dist-devices")
