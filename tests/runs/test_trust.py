"""A run folder is data, not code: eval.py builds a run folder's `_target_`s only as far as the command allows
(allowed_targets). The in-process checks of the allowlist: tests/unit/test_training_knobs.py."""
import shutil
import textwrap

import pytest

from support.driver import command_in_process
from support.processes import check_ok, python_path, run_eval
from support.references import adam
from support.run_files import walk


@pytest.mark.core
def test_eval_py_refuses_a_run_folders_package_until_allowed_targets_names_it(runs, tmp_path, monkeypatch, capsys):
    """A run folder whose model names a package this command does not allow: eval.py exits 2 with one line naming
    the target and allowed_targets, before the package is imported (its import would write a marker); naming the
    package in allowed_targets evaluates it (a real eval.py)."""
    run = tmp_path / "shared"
    shutil.copytree(runs.train(adam("single")).ok().run_dir, run)
    resolved = run / "resolved_config.yaml"
    resolved.write_text(resolved.read_text().replace("_target_: framework.models.lenet.LeNet",
                                                     "_target_: strangers.Net"))
    marker, package = tmp_path / "imported", tmp_path / "pkgs" / "strangers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        Path({str(marker)!r}).write_text("its code ran")
        from framework.models.lenet import LeNet as Net
        """))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))

    code, _, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={run}", "strategy=single"], tmp_path,
                                      monkeypatch, capsys)
    assert code == 2, err
    [line] = [text for text in err.splitlines() if text.startswith("error:")]
    assert line.startswith("error: model._target_=strangers.Net is not allowed: outside allowed_targets")
    assert line.endswith("allowed_targets=[strangers.*]") and "Traceback" not in err
    assert not marker.exists() and not walk(tmp_path, "eval.json")
    check_ok(run_eval([f"ckpt_path={run}", "strategy=single", "allowed_targets=[strangers.*]"], tmp_path / "eval",
                      env=python_path(tmp_path / "pkgs")))
    assert marker.exists()
