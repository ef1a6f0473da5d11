"""Starting and stopping real processes as a user does: train.py (and eval.py, sample.py) in a session of its own,
held at a step of the test's choosing (tests/support/faults/hold.py), stopped by a signal, its leftovers found."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from framework.session.slurm import _PORTS
from support.run_files import walk

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "train.py"
EVAL = REPO / "eval.py"
SAMPLE = REPO / "sample.py"
VERIFY = REPO / "verify.py"
EXAMPLE = REPO / "examples" / "my_project"
FAULTS = REPO / "tests" / "support" / "faults"  # test-only code a run loads from PYTHONPATH: fault injection
USER_CODE = REPO / "tests" / "support" / "user_code"  # what runs import from the tests: probes, models, callbacks

# Small enough for 2 CPU cores, real enough to learn: 2048 Fashion-MNIST images, 2 epochs.
TINY = [
    "dataset.max_train_samples=2048", "dataset.max_test_samples=512", "trainer.epochs=2",
    "trainer.batch_size=64", "trainer.log_every_n_steps=4",
]
# Each test's processes carry this variable with the test's own id (tests/conftest.py), so that whatever a test
# started and left (a timeout, a failure half-way) is found and ended with it.
TEST_ID = "HYDRA_DIST_TEST_ID"
OUTPUT_TAIL = 20_000  # of a command killed past its time, what its failure shows
PORT_TRIES = 100

# What a launcher leaves a process that it started as one rank of several (framework/session/environment.py reads
# them): a run that inherits them from the test process takes itself for a rank of a job that does not exist.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                  "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")


def launch_variables(environ) -> dict[str, str]:
    """What of `environ` says where a process runs among ranks: the rank variables, the rendezvous address, and
    SLURM's and submitit's variables (slurm.py maps them to ranks)."""
    return {name: value for name, value in environ.items()
            if name in (*RANK_VARIABLES, "MASTER_ADDR", "MASTER_PORT") or name.startswith(("SLURM_", "SUBMITIT_"))}


# The accelerator of the test that runs now: gpu for a test marked gpu, cpu for every other (tests/conftest.py).
accelerator = ["cpu"]


def pin_accelerator(args: list[str], accelerator_name: str | None = None) -> list[str]:
    """A run's overrides with trainer.accelerator added unless they name one (cpu in a CPU test, gpu in a test marked
    gpu), and dataset=synthetic in a run on the GPU that names no data. The suite passes on machines with any number
    of GPUs only if a test that assumes CPU workers (gloo, CPU timings, exact float sums) says so, and a GPU test that
    forgets to ask for the GPU would run on the CPU."""
    named = [a.split("=", 1)[1] for a in args if a.startswith(("trainer.accelerator=", "++trainer.accelerator="))]
    chosen = named[-1] if named else accelerator_name or accelerator[0]
    pinned = [] if named else [f"trainer.accelerator={chosen}"]
    # A GPU machine may have neither network nor Debian's Fashion-MNIST: GPU runs that name no data train on random
    # images of its shape (an evaluation, ckpt_path=..., takes its run's data), whoever asked for the GPU
    if chosen == "gpu" and not any(a.startswith(("dataset=", "experiment=", "ckpt_path=")) for a in args):
        pinned.append("dataset=synthetic")
    # right after the first override: Hydra's argument parser takes the overrides as one run of positional
    # arguments, and the user's own overrides keep their order (the sweep summary lists them as given)
    first = next((i + 1 for i, a in enumerate(args) if "=" in a and not a.startswith("-")), len(args))
    return [*args[:first], *pinned, *args[first:]]


def python_path(*folders: Path | str, env: dict | None = None) -> dict:
    """An environment whose runs import from these folders first (a user's package, tests/support/user_code)."""
    env = dict(env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, folders), env.get("PYTHONPATH"),
                                                      os.environ.get("PYTHONPATH")]))
    return env


def faults_env(env: dict | None = None) -> dict:
    """An environment whose runs can load tests/support/faults/ (fault injection, HoldAt) as callbacks."""
    return python_path(FAULTS, env=env)


def user_code_env(*extra: Path | str, env: dict | None = None) -> dict:
    """An environment whose runs can load tests/support/user_code/ (and `extra` folders) as components."""
    return python_path(USER_CODE, *extra, env=env)


def with_faults(args: list[str], env: dict | None, plan: str | None) -> tuple[list[str], dict]:
    """A run's overrides and environment with tests/support/faults/fault_injection.py's callback planning `plan`
    (<point>:<value>:<rank>[,...]), a callback like any other of the callbacks group."""
    if not plan:
        return list(args), dict(env or {})
    return ([*args, "+callbacks.faults._target_=fault_injection.FaultInjection", f"+callbacks.faults.plan='{plan}'"],
            faults_env(env))


def torchrun(nproc_per_node: int = 2) -> list[str]:
    """The launcher prefix of `torchrun --nproc_per_node=N --standalone`, for run_train(..., launcher=...)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc_per_node}", "--standalone"]


def run_train(args: list[str], cwd: Path, timeout: float = 240, env: dict | None = None,
              launcher: list[str] | None = None, faults: str | None = None,
              script: list[str] | None = None) -> subprocess.CompletedProcess:
    """train.py as a real subprocess, on the test's accelerator unless args name one (see pin_accelerator); faults:
    a fault injection plan (with_faults); script: another command in train.py's place (eval.py), args as given."""
    args, env = with_faults(args, env, faults)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    cmd = (launcher or [sys.executable]) + (script + list(args) if script else [str(TRAIN), *pin_accelerator(args)])
    return run_in_own_session(cmd, cwd, full_env, timeout)


def run_eval(args: list[str], cwd: Path, env: dict | None = None, timeout: float = 240,
             script: Path = EVAL) -> subprocess.CompletedProcess:
    """eval.py (or sample.py) as a real subprocess in the folder cwd (made here), on the test's accelerator."""
    cwd.mkdir(parents=True, exist_ok=True)
    return run_train(pin_accelerator(args), cwd, timeout=timeout, env=env, script=[str(script)])


def run_in_own_session(cmd: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, timeout=...), but in a process group of its own that is killed whole when the command runs
    past its time (subprocess.TimeoutExpired as before) or the test is interrupted (a test's timeout): killing only
    the driver would leave the elastic agent's workers holding their GPUs for the next test."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as stopped:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        stopped.add_note(f"so its process group was killed: {' '.join(map(str, cmd))[:300]}\nits output until then "
                         f"(the last {OUTPUT_TAIL} characters):\nstdout:\n{out[-OUTPUT_TAIL:]}\n"
                         f"stderr:\n{err[-OUTPUT_TAIL:]}")
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def check_ok(proc) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def held_at(args: list[str], step: int, rank: int = 0, runs: str = "*") -> list[str]:
    """A run's overrides with tests/support/faults/hold.py's callback: the run waits at the end of `step` on `rank`
    (in the runs whose folder's name matches `runs`) until the test lets it go or stops it. Run it with faults_env()."""
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
    stays, such as another job's result). Fails if the process ends first. marker: the files to wait for. The run
    goes on writing (and renaming) beside the markers: walk() takes that."""
    deadline = time.monotonic() + timeout
    while True:
        markers = walk(root, marker)
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


def kill_in_checkpoint(step: int, rank: int) -> dict:
    """The environment that makes `rank` die halfway through writing the checkpoint of `step` (tests/support/faults/)."""
    return faults_env({"HYDRA_DIST_TEST_KILL_IN_CHECKPOINT": f"{step}:{rank}"})


def processes_tagged(tag: str, variable: str | None = None) -> list[int]:
    """Pids of every process whose environment holds tag (tests put a fresh HYDRA_DIST_TEST_TAG into a run's
    environment; every process it starts inherits it, so a leftover worker shows here). variable: only where that
    variable has the value tag."""
    needle = (f"{variable}={tag}" if variable else tag).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if (needle in environ.split(b"\0")) if variable else (needle in environ):
            found.append(int(proc.name))
    return found


def gone_within(tag: str, seconds: float) -> list[int]:
    """Waits up to `seconds` for every process tagged `tag` to end; returns those still there."""
    deadline = time.monotonic() + seconds
    while processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_tagged(tag)


def command_of(pid: int) -> str:
    """A process's command line (its first 120 characters), or its pid where it has gone: what a leftover was."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    return str(pid)


def kill_tagged(tag: str, variable: str) -> list[int]:
    """SIGKILLs every process whose `variable` is tag (a test's leftovers); returns their pids."""
    found = processes_tagged(tag, variable)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def train_loss_curve(args: list[str], cwd: Path) -> list[tuple[int, float]]:
    """Train once in the folder cwd (made here) and return its loss/train series, (step, loss) in order."""
    from support.run_files import read_scalars, run_dirs

    cwd.mkdir(parents=True, exist_ok=True)
    check_ok(run_train(args, cwd))
    [run_dir] = run_dirs(cwd)
    return read_scalars(run_dir)["loss/train"]


def assert_killed_run_resumes(cwd: Path, args: list[str], fault: str, reference: Path, steps: int,
                              resumed_from: int, rel: float = 1e-6, env: dict | None = None) -> Path:
    """A worker dies at the fault's point (tests/support/faults/fault_injection.py; no restarts: the run fails); the
    same command with hydra.run.dir resumes from the checkpoint of step resumed_from and gives the reference run's
    loss at every step 1..steps (support.run_files.assert_continues). Returns the run folder."""
    from support.run_files import assert_continues, assert_resumed_from, run_dirs

    cwd.mkdir(parents=True, exist_ok=True)
    assert run_train(args, cwd, faults=fault, timeout=300, env=env).returncode != 0
    [run_dir] = run_dirs(cwd)
    out = check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], cwd, timeout=300, env=env))
    assert_resumed_from(out, resumed_from)
    assert_continues(reference, run_dir, steps, resumed_from, rel)
    return run_dir


def free_port() -> int:
    """A TCP port free on this machine now, for a rendezvous a test names itself: below the kernel's ephemeral range,
    where no process's outgoing connection can be given it between this check and the run's bind (a port from
    bind(0) is in that range), in the range framework/session/slurm.py picks SLURM tasks' ports from. A port
    that is taken (some server binds it) is skipped for another."""
    first, last = _PORTS[0], min(_PORTS[1], ephemeral_ports()[0] - 1)
    if last < first:
        raise RuntimeError(f"the kernel's ephemeral ports start at {last + 1}, below {first}: no port is safe to name")
    tries = random.SystemRandom()  # not seeded: two xdist workers pick apart
    for _ in range(PORT_TRIES):
        port = tries.randint(first, last)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free TCP port in {PORT_TRIES} tries between {first} and {last}")


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the ports of outgoing connections and bind(0) (Linux's default where /proc lacks it)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except OSError:
        return 32768, 60999
    return int(low), int(high)


def slurm_task(rank: int, tasks: int, job_id: str) -> dict:
    """What `srun --ntasks=<tasks> --gpus-per-task=1` leaves a task: SLURM's variables (the framework maps them to
    torch's ranks) and its one GPU, which it sees as cuda:0."""
    return {"SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": str(tasks),
            "SLURM_NTASKS": str(tasks), "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0",
            "SLURM_JOB_NODELIST": "localhost", "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "CUDA_VISIBLE_DEVICES": str(rank)}


def run_together(commands: list[tuple[list[str], dict]], cwd: Path, timeout: float, stderr=subprocess.PIPE,
                 cwds: list[Path] | None = None) -> list[subprocess.CompletedProcess]:
    """Several commands (command, full environment) started at once, each in a process group of its own (the tasks of
    one srun step, two nodes, two runs side by side), waited for together; past the time or if the test is
    interrupted every group is killed whole, as run_in_own_session does (their workers hold ports and GPUs). cwds:
    a folder for each command (default: cwd for all)."""
    procs = [subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                              start_new_session=True)
             for (cmd, env), folder in zip(commands, cwds or [cwd] * len(commands))]
    deadline = time.monotonic() + timeout
    try:
        outputs = [proc.communicate(timeout=max(1.0, deadline - time.monotonic())) for proc in procs]
    except BaseException:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.communicate()
        raise
    return [subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            for proc, (out, err) in zip(procs, outputs)]


def gpu_smoke_script():
    """scripts/gpu_smoke.py (`make test-gpu`'s matrix) as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "scripts" / "gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
