"""A sweep's job folder (`1_tp=2`) as a path on the command line: quoted for Hydra's override grammar before Hydra
parses it (framework/config/path_overrides.py), so eval.py, sample.py and trainer.resume take it as the user typed
it; what Hydra parses already is left alone, and a list of such paths is refused with how to quote it. eval.py on a
real sweep job's folder: tests/runs/test_refused_sweep_job.py."""
import pytest

from framework.config.path_overrides import quoted_paths
from support.driver import command_in_process


def test_a_path_hydra_cannot_parse_is_quoted_and_what_it_parses_is_left_alone():
    assert quoted_paths(["ckpt_path=out/3_lr=0.01_seed=2", "trainer.resume=out/1_tp=2/checkpoints",
                         "ckpt_path=out/a'b=1"]) == [
        "ckpt_path='out/3_lr=0.01_seed=2'", "trainer.resume='out/1_tp=2/checkpoints'", 'ckpt_path="out/a\'b=1"']
    as_typed = ["ckpt_path='out/1_tp=2'", 'ckpt_path="out/1_tp=2"', "ckpt_path=out/run", "strategy=ddp",
                "prompt=a=b", "-m", "ckpt_path=out/1_tp=2,out/2_tp=4", "+ckpt_path=out/run"]
    assert quoted_paths(as_typed) == as_typed


@pytest.mark.parametrize("command,script", [("eval_main", "eval.py"), ("sample_main", "sample.py")])
def test_a_sweep_job_folder_reaches_the_command_as_typed(tmp_path, monkeypatch, capsys, command, script):
    """The folder is not there: the command's own refusal names the path whole, so Hydra took it as one value."""
    job = tmp_path / "multirun" / "2026-01-01_00-00-00" / "1_tp=2"
    code, _, err = command_in_process(command, [script, f"ckpt_path={job}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    assert f"error: ckpt_path={job} is not allowed: no such" in err and "Could not parse" not in err


def test_a_list_of_paths_with_equals_signs_is_refused_with_how_to_quote_them(tmp_path, monkeypatch, capsys):
    paths = "out/1_tp=2,out/2_tp=4"
    code, _, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={paths}"], tmp_path, monkeypatch, capsys)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"error: Could not parse the override 'ckpt_path={paths}': ")
    assert line.endswith("; quote each path that holds '=' for Hydra, e.g. 'ckpt_path=\"out/1_tp=2\"' (a sweep: "
                         "'ckpt_path=\"<path>\",\"<path>\"')")
