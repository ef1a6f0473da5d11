"""`torchrun --nproc_per_node=2 train.py strategy=ddp`: we detect the workers, launch nothing, make one folder."""
import json

from conftest import TINY, check_ok, root_cause_exit_code, run_dirs, run_train, torchrun

TORCHRUN = torchrun()


def test_external_torchrun_makes_exactly_one_run_folder(tmp_path):
    out = check_ok(run_train(["strategy=ddp", *TINY, "trainer.epochs=1"], tmp_path, launcher=TORCHRUN))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == 2 and len(result["per_rank_samples_per_sec"]) == 2
    assert out.count("done: test accuracy") == 1


def test_torchrun_with_auto_strategy_becomes_ddp(tmp_path):
    out = check_ok(run_train([*TINY, "trainer.max_steps=2"], tmp_path, launcher=TORCHRUN))
    assert "strategy=auto chose ddp" in out
    [run_dir] = run_dirs(tmp_path)
    assert json.loads((run_dir / "result.json").read_text())["strategy"] == "ddp"


def test_torchrun_with_a_bad_value_fails_on_every_rank_without_hanging(tmp_path):
    proc = run_train(["strategy=ddp", "trainer.batch_size=0"], tmp_path, launcher=TORCHRUN, timeout=120)
    assert proc.returncode == 1  # torchrun's own code for a failed worker group
    assert root_cause_exit_code(proc.stderr) == 2, proc.stderr  # the first rank to end: a refusal's code
    assert proc.stderr.count("error: trainer.batch_size=0 is not allowed") == 1, proc.stderr
