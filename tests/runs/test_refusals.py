"""A refused run as a real process, once per way of being refused: exit code 2, the one `error:` line (on its own on
stderr where the refusal comes while Hydra composes), no traceback, no worker started and no run folder where the
config never composed. The refusals themselves are checked in-process, every one of them (tests/unit/
test_bad_inputs.py and each subject's unit tests, through support.driver); here, one of each kind: a value of the
wrong type for its schema (Hydra's composition), a choice, a misspelt strategy key, a range rule (the driver's
typing), a check across groups (preflight), Hydra's own message for an unknown option, and the output folder (a
Hydra callback, so only a real run meets it); eval.py's own refusal (a run folder's target outside
allowed_targets: eval.py's command and exit path in a real interpreter). In `make test-all` only, the refusals met
before or around Hydra, each its own launch: a strategy whose engine is not installed (deepspeed, horovod: their
import made to fail in that interpreter), a `--local_rank` that is no rank, and `-m` under torchrun. Other launch
situations have theirs beside their launcher's tests."""
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.bad_inputs import CASES
from support.driver import driver_says
from support.processes import TINY, root_cause_exit_code, run_eval, run_train, torchrun
from support.references import adam
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


@pytest.mark.core
def test_eval_py_refuses_a_run_folders_target_with_one_line_and_exit_2(runs, tmp_path):
    """A copy of a shared run whose model names a package this command does not allow: eval.py's composition, its
    allowlist check and its exit in a real interpreter (tests/runs/test_trust.py has the same refusal in-process and
    the evaluation once the package is allowed)."""
    run = shutil.copytree(runs.train(adam("single")).ok().run_dir, tmp_path / "run")
    resolved = run / "resolved_config.yaml"
    resolved.write_text(resolved.read_text().replace("_target_: framework.models.lenet.LeNet",
                                                     "_target_: strangers.Net"))
    proc = run_eval([f"ckpt_path={run}", "strategy=single"], tmp_path / "eval", timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: model._target_=strangers.Net is not allowed: outside allowed_targets"), \
        proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("allowed_targets=[strangers.*]\n"), proc.stderr
    assert not walk(tmp_path / "eval", "eval.json"), "nothing was evaluated"


def hiding(*packages: str) -> list[str]:
    """A launcher: python, with these packages' import made to fail (None in sys.modules is Python's own way), as on
    a machine where they are not installed, then running the script and its arguments as `python <script>` would."""
    hide = "".join(f"sys.modules[{name!r}] = None; " for name in packages)
    return [sys.executable, "-c", f"import runpy, sys; {hide}sys.argv = sys.argv[1:]; "
                                  "runpy.run_path(sys.argv[0], run_name='__main__')"]


# name: (overrides, launcher, the refusal's line: its start, and what else it says). Each is a launch of its own:
# what they check is how a process starts.
AROUND_HYDRA = {
    "without_deepspeed": (["strategy=deepspeed", *TINY], hiding("deepspeed"),
                          ("error: strategy=deepspeed is not allowed here: DeepSpeed is not installed",
                           "install it with `pip install '.[deepspeed]'`")),
    "without_horovod": (["strategy=horovod", *TINY], hiding("horovod"),
                        ("error: strategy=horovod is not allowed: horovod is not usable here",
                         "install it with: bash scripts/setup.d/10-horovod.sh .venv")),
    "local_rank_not_a_number": (["--local_rank=x", "strategy=ddp", *TINY], None,
                                ("error: --local_rank='x' is not allowed: expected a local rank (an integer >= 0)",)),
    "multirun_under_torchrun": (["-m", "strategy=ddp", *TINY], torchrun(),
                                ("error: -m/--multirun is not allowed under torchrun; run the sweep without it",)),
}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Each case of AROUND_HYDRA as a real command, two at a time."""
    root = tmp_path_factory.mktemp("around")

    def one(name):
        args, launcher, _ = AROUND_HYDRA[name]
        cwd = root / name
        cwd.mkdir()
        return name, cwd, run_train(args, cwd, timeout=180, launcher=launcher)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return {name: (cwd, proc) for name, cwd, proc in pool.map(one, AROUND_HYDRA)}


@pytest.mark.parametrize("name", list(AROUND_HYDRA))
def test_a_refusal_around_hydra_exits_2_with_its_line_once(launched, name):
    cwd, proc = launched[name]
    start, *also = AROUND_HYDRA[name][2]
    [line] = [text for text in proc.stderr.splitlines() if text.startswith("error:")]
    assert line.startswith(start) and all(words in line for words in also), proc.stderr
    assert not walk(cwd, "events.out.tfevents*") and "training " not in proc.stdout, "a worker started"
    if name == "multirun_under_torchrun":  # torchrun's agent exits 1 for a failed group and prints its own traceback
        assert proc.returncode == 1 and root_cause_exit_code(proc.stderr) == 2, proc.stderr
        assert proc.stderr.count("Traceback") == proc.stderr.count("raise ChildFailedError(") == 1, proc.stderr
    else:
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == line + "\n", proc.stderr
