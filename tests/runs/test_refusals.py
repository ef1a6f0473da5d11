"""A refused run as a real process, once per way of being refused: exit code 2, the one `error:` line (on its own on
stderr where the refusal comes while Hydra composes), no traceback, no worker started and no run folder where the
config never composed. The refusals themselves are checked in-process, every one of them (tests/unit/
test_bad_inputs.py and each subject's unit tests, through support.driver); here, one of each kind: a value of the
wrong type for its schema (Hydra's composition), a choice, a misspelt strategy key, a range rule (the driver's
typing), a check across groups (preflight), Hydra's own message for an unknown option, and the output folder (a
Hydra callback, so only a real run meets it). Other launch situations have theirs beside their launcher's tests."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.bad_inputs import CASES
from support.driver import driver_says
from support.processes import TINY
from support.run_files import walk

AS_PROCESSES = {name: CASES[name] for name in ("epochs_text", "batch_zero", "batch_not_divisible", "unknown_model",
                                               "unwritable_output")}
AS_PROCESSES["choice"] = (["trainer.precision=fp8"],
                          "trainer.precision='fp8' is not allowed: expected one of fp32, bf16, fp16")
AS_PROCESSES["misspelt_strategy_key"] = (["strategy=ddp", "strategy.bucket_cap=30"],
                                         "Could not override 'strategy.bucket_cap': strategy has no key 'bucket_cap' "
                                         "(its keys: name, nproc_per_node, ")
# a preset whose data is not on this machine, with downloads off (its folder: the run's own, empty)
AS_PROCESSES["missing_data"] = (["experiment=simple_cnn_mnist", "dataset.download=false", "dataset.download_dir={cwd}"],
                                "error: dataset=mnist: no usable files found")
# a user's model that fails on the dataset's batches in the driver's dry run: its exception is one line too
AS_PROCESSES["model_cannot_take_the_batches"] = (["model._target_=torchvision.models.mobilenet_v3_small", *TINY],
                                                 "error: model=torchvision.models.mobilenet_v3_small cannot take")
WHOLE_STDERR = ("choice", "misspelt_strategy_key")  # refused while composing: the line is all stderr holds


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Each case as `python train.py <its overrides>`, two at a time (each waits on a start of its own)."""
    from support.processes import run_train

    root = tmp_path_factory.mktemp("bad")

    def one(name):
        cwd = root / name
        cwd.mkdir()
        args = [a.format(cwd=cwd) for a in AS_PROCESSES[name][0]]
        env = {"HYDRA_DIST_DATA": str(cwd)} if name == "missing_data" else {}  # no data found anywhere
        return name, cwd, run_train(args, cwd, timeout=120, env=env)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: (cwd, proc) for name, cwd, proc in pool.map(one, AS_PROCESSES)}


@pytest.mark.core
@pytest.mark.parametrize("name", list(AS_PROCESSES))
def test_a_refused_run_exits_with_one_line_before_any_worker(outcomes, name):
    cwd, proc = outcomes[name]
    expected = AS_PROCESSES[name][1]
    assert proc.returncode == 2, proc.stderr  # every refusal, wherever it is found (framework/session/situations.py)
    assert expected in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not walk(cwd, "events.out.tfevents*"), "a worker started"
    assert "training " not in proc.stdout
    if name in WHOLE_STDERR:
        assert proc.stderr.startswith(f"error: {expected}") and proc.stderr.count("\n") == 1, proc.stderr
        assert not (cwd / "outputs").exists()  # refused while composing: no run folder
    if name == "missing_data":
        assert "dataset.download=false" in proc.stderr
    if name == "choice":
        assert proc.stderr == f"error: {expected}\n"


def test_a_checkpoint_of_another_model_is_refused_by_the_driver(runs, tmp_path):
    other = runs.train(["model=simple_cnn", "strategy=single", "trainer.max_steps=1", "dataset.max_train_samples=256",
                        "dataset.max_test_samples=64"]).ok()
    args, expected = CASES["resume_other_model"]
    line = driver_says([a.format(other_model_run=other.run_dir) for a in args], tmp_path)
    assert expected.format(other_model_run=other.run_dir) in line, line
