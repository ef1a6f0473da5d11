"""`torchrun --nproc_per_node=2 train.py`: we detect the workers, launch nothing, make one folder; strategy=auto
becomes ddp there; a bad value fails on every rank without hanging. torchrun's start is each run's subject."""
import pytest

from support.processes import TINY, root_cause_exit_code, run_train, torchrun

TORCHRUN = torchrun()


def under_torchrun(runs):
    """One run under torchrun, strategy=auto (which becomes ddp), read by the first two tests."""
    return runs.train([*TINY, "trainer.epochs=1"], launcher=TORCHRUN).ok()


@pytest.mark.core
def test_external_torchrun_makes_exactly_one_run_folder(runs):
    run = under_torchrun(runs)
    assert len(run.jobs) == 1
    result = run.result()
    assert result["processes"] == 2 and len(result["per_rank_samples_per_sec"]) == 2
    assert run.stdout.count("done: test accuracy") == 1


@pytest.mark.core
def test_torchrun_with_auto_strategy_becomes_ddp(runs):
    run = under_torchrun(runs)
    assert "strategy=auto chose ddp" in run.stdout
    assert run.result()["strategy"] == "ddp"


def test_torchrun_with_a_bad_value_fails_on_every_rank_without_hanging(tmp_path):
    proc = run_train(["strategy=ddp", "trainer.batch_size=0"], tmp_path, launcher=TORCHRUN, timeout=120)
    assert proc.returncode == 1  # torchrun's own code for a failed worker group
    assert root_cause_exit_code(proc.stderr) == 2, proc.stderr  # the first rank to end: a refusal's code
    assert proc.stderr.count("error: trainer.batch_size=0 is not allowed") == 1, proc.stderr
