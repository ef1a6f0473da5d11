"""Helpers shared by the tests: run train.py as a user would (a real subprocess), read TensorBoard
event files back with TensorBoard's own reader."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import framework.config  # noqa: F401  (registers the config schemas: the tests compose conf/ with Hydra too)
from framework.session.environment import ranks
from framework.config.hydra_versions import version_base

pytest_plugins = ["pytester"]  # tests/test_cuda_paths.py checks this conftest's own pinning in a pytest of its own

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "train.py"
FAULTS = REPO / "tests" / "faults"  # test-only code a run loads from PYTHONPATH: fault injection

# Small enough for 2 CPU cores, real enough to learn: 2048 Fashion-MNIST images, 2 epochs.
TINY = [
    "dataset.max_train_samples=2048", "dataset.max_test_samples=512", "trainer.epochs=2",
    "trainer.batch_size=64", "trainer.log_every_n_steps=4",
]


# The accelerator of the test that runs now: gpu for a test marked gpu, cpu for every other (set per test below).
_accelerator = ["cpu"]


@pytest.fixture(autouse=True)
def _test_accelerator(request):
    """Pins the accelerator runs of this test use (see pin_accelerator), and after a GPU test puts back the current
    CUDA device: a test that left set_device(1) would make the next one time cuda:0 while its work runs on cuda:1."""
    gpu_test = request.node.get_closest_marker("gpu") is not None
    _accelerator[0] = "gpu" if gpu_test else "cpu"
    device = torch.cuda.current_device() if gpu_test and torch.cuda.is_available() else None
    yield
    _accelerator[0] = "cpu"
    if device is not None:
        torch.cuda.set_device(device)


def pytest_configure(config):
    """The tests that stop a run with Ctrl-C send SIGINT to processes they start, which inherit this process's ignored
    and blocked signals across exec: a suite started as a shell's background job (`make test &`, a CI script run
    with `&`) has SIGINT and SIGQUIT ignored, so every driver it started ignored the test's Ctrl-C and the workers
    outlived the agent's SIGINT until its SIGKILL 30 s later. The stop signals are put back to Python's own."""
    for sig, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                         (signal.SIGQUIT, signal.SIG_DFL)):
        if signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGQUIT})


@pytest.fixture(autouse=True)
def _ranks_read_per_test():
    """A process reads its ranks once (framework/session/environment.py); each test reads them again, so that one
    test's faked environment does not stay in the next one's."""
    ranks.cache_clear()
    yield
    ranks.cache_clear()


@pytest.fixture(autouse=True)
def _forget_user_packages():
    """Tests that import a copy of examples/my_project in this process (driver checks in-process) each bring their
    own copy: the next test must import its own, not find the last one's in sys.modules."""
    yield
    for name in [n for n in sys.modules if n == "mypkg" or n.startswith("mypkg.")]:
        del sys.modules[name]


def pin_accelerator(args: list[str], accelerator: str | None = None) -> list[str]:
    """A run's overrides with trainer.accelerator added unless they name one (cpu in a CPU test, gpu in a test marked
    gpu), and dataset=synthetic in a run on the GPU that names no data. The suite passes on machines with any number
    of GPUs only if a test that assumes CPU workers (gloo, CPU timings, exact float sums) says so, and a GPU test that
    forgets to ask for the GPU would run on the CPU."""
    named = [a.split("=", 1)[1] for a in args if a.startswith(("trainer.accelerator=", "++trainer.accelerator="))]
    accelerator = named[-1] if named else accelerator or _accelerator[0]
    pinned = [] if named else [f"trainer.accelerator={accelerator}"]
    # A GPU machine may have neither network nor Debian's Fashion-MNIST: GPU runs that name no data train on random
    # images of its shape (an evaluation, ckpt_path=..., takes its run's data), whoever asked for the GPU
    if accelerator == "gpu" and not any(a.startswith(("dataset=", "experiment=", "ckpt_path=")) for a in args):
        pinned.append("dataset=synthetic")
    # right after the first override: Hydra's argument parser takes the overrides as one run of positional
    # arguments, and the user's own overrides keep their order (the sweep summary lists them as given)
    first = next((i + 1 for i, a in enumerate(args) if "=" in a and not a.startswith("-")), len(args))
    return [*args[:first], *pinned, *args[first:]]


def with_faults(args: list[str], env: dict | None, plan: str | None) -> tuple[list[str], dict]:
    """A run's overrides and environment with tests/faults/fault_injection.py's callback planning `plan`
    (<point>:<value>:<rank>[,...]), a callback like any other of the callbacks group."""
    if not plan:
        return list(args), dict(env or {})
    return ([*args, "+callbacks.faults._target_=fault_injection.FaultInjection", f"+callbacks.faults.plan='{plan}'"],
            faults_env(env))


def torchrun(nproc_per_node: int = 2) -> list[str]:
    """The launcher prefix of `torchrun --nproc_per_node=N --standalone`, for run_train(..., launcher=...)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}", "--standalone"]


def run_train(args: list[str], cwd: Path, timeout: int = 240, env: dict | None = None,
              launcher: list[str] | None = None, faults: str | None = None) -> subprocess.CompletedProcess:
    """train.py as a real subprocess, on the test's accelerator unless args name one (see pin_accelerator); faults:
    a fault injection plan (with_faults)."""
    args, env = with_faults(args, env, faults)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    cmd = (launcher or [sys.executable]) + [str(TRAIN), *pin_accelerator(args)]
    return run_in_own_session(cmd, cwd, full_env, timeout)


def run_in_own_session(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, timeout=...), but in a process group of its own that is killed whole when the command runs
    past its time (subprocess.TimeoutExpired as before) or the test is interrupted: killing only the driver would
    leave the elastic agent's workers holding their GPUs for the next test (as scripts/gpu_smoke.py does)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def faults_env(env: dict | None = None) -> dict:
    """An environment whose runs can load tests/faults/ (fault injection, HoldAt) as callbacks."""
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAULTS), env.get("PYTHONPATH"), os.environ.get("PYTHONPATH")]))
    return env


def held_at(args: list[str], step: int, rank: int = 0, runs: str = "*") -> list[str]:
    """A run's overrides with tests/faults/hold.py's callback: the run waits at the end of `step` on `rank` (in the
    runs whose folder's name matches `runs`) until the test lets it go or stops it. Run it with faults_env()."""
    return [*args, "+callbacks.hold._target_=hold.HoldAt", f"+callbacks.hold.step={step}",
            f"+callbacks.hold.rank={rank}", f"+callbacks.hold.runs='{runs}'"]


def start_train(args: list[str], cwd: Path, env: dict | None = None, logs: Path | None = None,
                **popen) -> subprocess.Popen:
    """train.py started (not waited for), its output in train.out and train.err in `logs` (default: cwd): a test that
    waits on the run's files must not leave a pipe to fill up."""
    logs = logs or cwd
    return subprocess.Popen([sys.executable, str(TRAIN), *pin_accelerator(args)], cwd=cwd, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                            stdout=(logs / "train.out").open("w"), stderr=(logs / "train.err").open("w"), **popen)


def wait_until_held(proc: subprocess.Popen, root: Path, count: int = 1, also=lambda: True, timeout: float = 300,
                    marker: str = "held_at_step_*") -> list[Path]:
    """The markers of `count` runs under root that wait where HoldAt holds them (and `also()` is true: a state that
    stays, such as another job's result). Fails if the process ends first. marker: the files to wait for."""
    deadline = time.monotonic() + timeout
    while True:
        markers = sorted(root.rglob(marker))
        if len(markers) >= count and also():
            return markers
        assert proc.poll() is None, f"the run ended before it reached the step it was to wait at (exit {proc.returncode})"
        assert time.monotonic() < deadline, f"no run waits at its step after {timeout} s"
        time.sleep(0.05)


def stop_in_second_job(args: list[str], cwd: Path, sig: int) -> tuple[subprocess.Popen, str, list[str]]:
    """Start a sweep whose jobs run one after the other, and whose second job waits at the end of step 3 (the first
    job done, the second's step-2 checkpoint written); then send sig to the driver. Returns the ended process, its
    stderr and the sweep's arguments (the hold included: run again, the sweep must compose the same configs; its
    second job goes past step 3 then)."""
    args = held_at(args, step=3, runs="1_*")
    proc = start_train(args, cwd, faults_env())
    wait_until_held(proc, cwd)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc, (cwd / "train.err").read_text(), args


def root_cause_exit_code(output: str) -> int:
    """The exit code torch's elastic agent (torchrun, torch.distributed.launch) reports for the first rank that
    failed (its own exit code is 1 whatever the ranks' were)."""
    cause = output.split("Root Cause (first observed failure):", 1)[1]
    return int(cause.split("exitcode", 1)[1].split(":", 1)[1].split()[0])


def check_ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def run_dirs(root: Path) -> list[Path]:
    """Every Hydra job folder under root/outputs (a folder with a .hydra subfolder). Read while a run may be writing
    there: a folder it renames away during the walk (checkpoints/best.old) means walk again."""
    while (root / "outputs").is_dir():
        try:
            return sorted(p.parent for p in (root / "outputs").rglob(".hydra"))
        except FileNotFoundError:
            continue
    return []


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def losses_by_step(run_dir: Path) -> dict[int, float]:
    """loss/train by step; after a restart the redone steps appear again and the last value wins."""
    return dict(read_scalars(run_dir)["loss/train"])


def train_loss_curve(args: list[str], cwd: Path) -> list[tuple[int, float]]:
    """Train once in the folder cwd (made here) and return its loss/train series, (step, loss) in order."""
    cwd.mkdir(parents=True, exist_ok=True)
    check_ok(run_train(args, cwd))
    [run_dir] = run_dirs(cwd)
    return read_scalars(run_dir)["loss/train"]


def assert_curves_match(reference: list[tuple[int, float]], other: list[tuple[int, float]], rel: float,
                        names: tuple[str, str]) -> None:
    """Step by step (paired in order), other's loss is within rel of reference's."""
    for (step, a), (_, b) in zip(reference, other):
        assert abs(a - b) <= rel * abs(a), f"step {step}: {names[0]} {a} vs {names[1]} {b}"


def kill_in_checkpoint(step: int, rank: int) -> dict:
    """The environment that makes `rank` die halfway through writing the checkpoint of `step` (tests/faults/)."""
    path = os.pathsep.join(filter(None, [str(FAULTS), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "HYDRA_DIST_TEST_KILL_IN_CHECKPOINT": f"{step}:{rank}"}


def processes_tagged(tag: str) -> list[int]:
    """Pids of every process whose environment holds tag (tests put a fresh HYDRA_DIST_TEST_TAG into a run's
    environment; every process it starts inherits it, so a leftover worker shows here)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if tag.encode() in (proc / "environ").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


def assert_killed_run_resumes(cwd: Path, args: list[str], fault: str, reference: Path, steps: int,
                              resumed_from: int, rel: float = 1e-6) -> Path:
    """A worker dies at the fault's point (tests/faults/fault_injection.py; no restarts: the run fails); the same command with
    hydra.run.dir resumes from the checkpoint of step resumed_from and gives the reference run's loss at every step
    1..steps (within rel; on a GPU, whose kernels may sum in another order, compare the steps after resumed_from
    with a looser rel: a restart from scratch would be far off). Returns the run folder."""
    cwd.mkdir(parents=True, exist_ok=True)
    assert run_train(args, cwd, faults=fault, timeout=300).returncode != 0
    [run_dir] = run_dirs(cwd)
    out = check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], cwd, timeout=300))
    # a single-file checkpoint is step-N.pt, a sharded one the folder step-N
    assert "resumed from" in out and re.search(rf"step-{resumed_from:08d}(\.pt)? \(step {resumed_from}\b", out), out
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, steps + 1))
    for step in expected if rel <= 1e-6 else range(resumed_from + 1, steps + 1):
        assert got[step] == pytest.approx(expected[step], rel=rel), f"step {step}"
    return run_dir


def composed(*overrides: str, hydra: bool = False, config_name: str = "config", config_dir: Path | None = None):
    """conf/ composed with Hydra's compose API, as the driver composes it (config_name: eval or sample for eval.py's
    and sample.py's; config_dir: a --config-dir's groups too)."""
    from hydra import compose, initialize_config_dir

    from framework.common.paths import config_dir_override

    extra = [config_dir_override(str(config_dir))] if config_dir else []
    with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()):
        return compose(config_name, overrides=[*overrides, *extra], return_hydra_config=hydra)


def driver_says(overrides: list[str], run_dir: Path, config_dir: Path | None = None) -> str:
    """The driver's verdict on these overrides, in this process: Hydra composes conf/ with the schemas, the driver
    types the config and runs every check before a worker would start (framework/run.py: plan_run), exactly as
    `python train.py` does, but without a process of its own (they cost seconds each on 2 cores). Returns the line
    `python train.py` prints after `error: `, or '' when the driver accepts the run. tests/test_bad_inputs.py runs
    some cases as real processes too, for the exit code, the one line and that no worker starts."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from framework.cli import composition_error_line
    from framework.common.errors import ConfigError
    from framework.common.paths import config_dir_override
    from framework.run import plan_run

    extra = [config_dir_override(str(config_dir))] if config_dir else []
    try:
        with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()):
            cfg = compose("config", overrides=[*pin_accelerator(list(overrides)), *extra])
            plan_run(cfg, run_dir)
    except HydraException as exc:
        return composition_error_line(exc)
    except ConfigError as exc:
        return str(exc)
    return ""


def strategy_for(*overrides: str):
    """The strategy a run of these overrides would build (strategy=auto resolved for this machine), not set up."""
    from framework.config.settings import settings_of
    from framework.strategies import build_strategy, resolve_auto, strategy_class

    cfg = composed(*overrides)
    resolve_auto(cfg, outer_kind=None)
    settings = settings_of(cfg, strategy_class(cfg.strategy).Options)
    return build_strategy(settings.strategy, settings.trainer)


def needs_gpus(count: int = 1):
    """Marks a test `gpu` (select them with -m gpu) and skips it where fewer than `count` CUDA GPUs are visible."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0

    def mark(test):
        test = pytest.mark.gpu(test)
        return pytest.mark.skipif(have < count, reason=f"needs {count} CUDA GPU(s), {have} visible")(test)

    return mark


needs_gpu = needs_gpus(1)


# ---- which tests start processes: marked `slow` (the in-process rest runs again against Hydra 1.4: make test-hydra14)
# Read from the source: a test is a process test when it, a fixture it uses, or a helper of the tests they call
# (transitively) names one of these. A test may also say so itself (@pytest.mark.slow).
_STARTS_PROCESSES = {"run_train", "subprocess", "Popen", "spawn", "runpytest_subprocess", "processes_tagged"}
_starts: dict = {}


def _names_in(function) -> set[str]:
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(tree) if isinstance(n, (ast.Name, ast.Attribute))}


def _starts_processes(function) -> bool:
    """Whether a test-side function (of tests/) names a process starter, itself or through the test helpers it calls."""
    function = getattr(function, "__wrapped__", function)
    key = getattr(function, "__code__", function)
    if key in _starts:
        return _starts[key]
    _starts[key] = False  # a helper that recurses into itself
    names = _names_in(function)
    found = bool(names & _STARTS_PROCESSES)
    scope = getattr(function, "__globals__", {})
    for name in names - _STARTS_PROCESSES:
        helper = scope.get(name)
        if found:
            break
        if callable(helper) and Path(getattr(getattr(helper, "__code__", None), "co_filename", "/")).parent == REPO / "tests":
            found = _starts_processes(helper)
    _starts[key] = found
    return found


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is not None or not hasattr(item, "function"):
            continue
        fixtures = getattr(item, "_fixtureinfo", None)
        definitions = [d for defs in (fixtures.name2fixturedefs.values() if fixtures else ()) for d in defs]
        functions = [item.function, *(d.func for d in definitions
                                      if Path(getattr(d.func, "__code__", None).co_filename if hasattr(d.func, "__code__") else "/").parent == REPO / "tests")]
        if any(_starts_processes(f) for f in functions):
            item.add_marker(pytest.mark.slow)
