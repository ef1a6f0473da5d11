"""Launchers that exist, as Hydra config, with real jobs: submitit (local here), plain srun-style tasks, joblib for
parallel jobs on one machine, the Optuna sweeper, sweeps stopped and resumed, and a checkout's own code in every
worker. Each test here starts its own processes: the launch is its subject. SLURM's variables, the slurm preset's
sbatch file and joblib's slots, in-process: tests/unit/test_launchers.py."""
import csv
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from framework.session.slurm import _PORTS
from support.processes import (
    REPO,
    TINY,
    TRAIN,
    check_ok,
    faults_env,
    gone_within,
    held_at,
    pin_accelerator,
    run_train,
    start_train,
    wait_until_held,
)
from support.run_files import losses_by_step, read_scalars, run_dirs, walk


def _summary_rows(sweep_dir):
    with open(sweep_dir / "summary.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.core
def test_submitit_local_runs_a_two_task_ddp_job_as_two_ranks(tmp_path):
    out = check_ok(run_train(["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                              "strategy=ddp", *TINY, "trainer.epochs=1"], tmp_path, timeout=300))
    [run_dir] = run_dirs(tmp_path)  # one folder although both tasks ran Hydra's job
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == 2 and len(result["per_rank_samples_per_sec"]) == 2
    tags = read_scalars(run_dir)
    assert {"throughput/samples_per_sec/rank0", "throughput/samples_per_sec/rank1"} <= set(tags)
    [row] = _summary_rows(run_dir.parent)
    assert row["status"] == "ok" and float(row["test_acc"]) == round(result["test_acc"], 4)
    assert "sweep summary" in out

    logs = {p.name: p.read_text() for p in walk(run_dir.parent / ".submitit", "*_log.out")}
    rank0 = next(text for name, text in logs.items() if name.endswith("_0_log.out"))
    rank1 = next(text for name, text in logs.items() if name.endswith("_1_log.out"))
    assert "done: test accuracy" in rank0 and "done:" not in rank1  # rank 0 reports, rank 1 follows
    assert "CPU workers on gloo" not in rank0 + rank1, "a task must not start workers of its own"


def test_submitit_tasks_with_a_bad_value_fail_on_every_rank_without_hanging(tmp_path):
    proc = run_train(["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "strategy=ddp",
                      "trainer.batch_size=0"], tmp_path, timeout=180)
    assert proc.returncode == 1 and "1 sweep job(s) failed: 0" in proc.stderr
    [run_dir] = run_dirs(tmp_path)
    errors = [p.read_text() for p in walk(run_dir.parent / ".submitit", "*_log.err")]
    assert len(errors) == 2 and all("trainer.batch_size=0 is not allowed" in e for e in errors)
    # rank 1 finds no error itself and gets rank 0's; both leave the group the same way (with nccl a rank
    # waiting in a barrier for one that already left would hang for the group's 10-minute timeout)
    assert all("Traceback" not in e and "Connection" not in e for e in errors), errors


def _job_id_with_a_free_port() -> str:
    """A job id whose port (derived from it, as every task derives it) is free here now."""
    for job in itertools.count(os.getpid()):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", random.Random(str(job)).randint(*_PORTS)))
                return str(job)
            except OSError:
                continue


def _srun_tasks(cwd: Path, args: list[str]) -> list[tuple[int, str, str]]:
    """What `srun --ntasks=2 python train.py ...` starts: two tasks that know only SLURM's variables. Returns each
    one's (exit code, stdout, stderr)."""
    # The rendezvous port is derived from SLURM_JOB_ID, so a job id of our own.
    slurm = {"SLURM_JOB_ID": _job_id_with_a_free_port(), "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
             "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "localhost"}
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    tasks = [
        subprocess.Popen([sys.executable, str(TRAIN), *pin_accelerator(args)], cwd=cwd,
                         env={**base, **slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "PYTHONUNBUFFERED": "1"},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    outputs = [task.communicate(timeout=240) for task in tasks]
    return [(task.returncode, out, err) for task, (out, err) in zip(tasks, outputs)]


@pytest.mark.core
def test_srun_tasks_take_their_ranks_from_slurm_and_make_one_run_folder(tmp_path):
    ended = _srun_tasks(tmp_path, ["strategy=ddp", *TINY, "trainer.max_steps=8"])
    for code, out, err in ended:
        assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == 2 and result["strategy"] == "ddp"
    assert "done: test accuracy" in ended[0][1] and "done:" not in ended[1][1]


def test_srun_tasks_with_a_bad_value_both_exit_2_each_saying_it_once(tmp_path):
    """A refusal in a SLURM task: rank 0 says it and tells rank 1, which says it in its own log; both exit 2."""
    ended = _srun_tasks(tmp_path, ["strategy=ddp", "trainer.batch_size=0"])
    for code, out, err in ended:
        assert code == 2, err
        assert err.count("error: trainer.batch_size=0 is not allowed: expected an integer >= 1") == 1, err
        assert "Traceback" not in err


@pytest.mark.core
def test_joblib_runs_two_ddp_jobs_at_once_each_on_its_own_cores(tmp_path):
    out = check_ok(run_train(["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=ddp",
                              "trainer.seed=1,2", *TINY, "trainer.max_steps=8"], tmp_path, timeout=400))
    # A slot stays locked while the worker process holding it lives, so slot 2 means two workers at once.
    assert "parallel job slot 1/2" in out and "parallel job slot 2/2" in out
    jobs = run_dirs(tmp_path)
    assert [j.name for j in jobs] == ["0_seed=1", "1_seed=2"]  # named in the joblib workers by what varies
    rows = _summary_rows(jobs[0].parent)
    assert [r["status"] for r in rows] == ["ok", "ok"]  # each ddp job used its own rendezvous port
    assert all(len(r["per_rank_samples_per_sec"].split(" / ")) == 2 for r in rows)
    cores = len(os.sched_getaffinity(0))
    if cores >= 2:
        assert f"{cores // 2} CPU core(s)" in out


# Tiny jobs on random images, a checkpoint every 4 steps: a sweep is stopped once a job finished while another waits
# at the end of its step 8 (tests/support/faults/hold.py), then run again into its folder.
STOPPABLE_SWEEP = ["-m", "dataset=synthetic", "dataset.train_size=1024", "dataset.test_size=64",
                   "trainer.batch_size=32", "trainer.log_every_n_steps=4", "trainer.checkpoint_every_n_steps=4"]


def _job_state(job: Path) -> str:
    if (job / "result.json").exists():
        return "finished"
    return "stopped" if list((job / "checkpoints").glob("step-*.json")) else "fresh"


def _stop_sweep(args: list[str], cwd: Path, sig: int, tag: str, env: dict | None = None) -> subprocess.Popen:
    """Start the sweep's driver in a session of its own (as a terminal's foreground group), its output in files; once
    a job finished and job 1 waits at the end of its step 8 (its step-4 checkpoint written; `args` hold it there:
    held_at), stop it: Ctrl-C (SIGINT to the whole group, as a terminal sends it) or SIGKILL of the driver alone."""
    proc = start_train(args, cwd, {**faults_env(env), "HYDRA_DIST_TEST_TAG": tag}, start_new_session=True)
    wait_until_held(proc, cwd, also=lambda: "finished" in map(_job_state, run_dirs(cwd)))
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    proc.wait(timeout=60)
    return proc


def _assert_nothing_left(tag: str, driver: int) -> None:
    """No process of the run is left (within a few seconds), nor a file of its pool's in /dev/shm or the temp folder."""
    assert not gone_within(tag, 10), "processes of the stopped sweep are left running"
    left = [name for folder in ("/dev/shm", tempfile.gettempdir()) if os.path.isdir(folder)
            for name in os.listdir(folder) if f"-{driver}-" in name or f"_{driver}_" in name]
    assert not left, left


def _resume_args(proc: subprocess.Popen, cwd: Path, args: list[str], sweep_dir: Path) -> list[str]:
    """After Ctrl-C, the command the driver printed (once); after SIGKILL, the user names the folder."""
    if proc.returncode == -signal.SIGKILL:
        return [*pin_accelerator(args), f"hydra.sweep.dir={sweep_dir}"]
    err = (cwd / "train.err").read_text()
    assert proc.returncode == 128 + signal.SIGINT, err
    [line] = [line for line in err.splitlines() + (cwd / "train.out").read_text().splitlines() if "To resume" in line]
    command = shlex.split(line.removeprefix("To resume: "))
    assert command[:2] == ["python", str(TRAIN)] and command[-1] == f"hydra.sweep.dir={sweep_dir.absolute()}"
    return command[2:]


def _assert_resumed_as_it_was_left(out: str, before: dict[Path, str], results: dict[Path, str]) -> None:
    """Finished jobs are reported (not trained again), stopped ones resume from their checkpoint and train to their
    last step, the rest run."""
    for job, state in before.items():
        if state == "finished":
            assert f"job {job.name.split('_')[0]} finished before in {job}: not trained again" in out
            assert (job / "result.json").read_text() == results[job]
        elif state == "stopped":
            assert f"resumed from {job}/checkpoints/step-" in out
            max_steps = yaml.safe_load((job / "resolved_config.yaml").read_text())["trainer"]["max_steps"]
            assert max(losses_by_step(job)) == max_steps
        else:
            assert f"run folder {job}" in out


def _stopped_state(tmp_path: Path, proc: subprocess.Popen, tag: str) -> tuple[Path, dict, dict]:
    """After the stop: nothing left running; the sweep folder, each job's state, the finished jobs' result.json."""
    _assert_nothing_left(tag, proc.pid)
    jobs = run_dirs(tmp_path)
    before = {job: _job_state(job) for job in jobs}
    assert {"finished", "stopped"} <= set(before.values()), before
    results = {job: (job / "result.json").read_text() for job, state in before.items() if state == "finished"}
    return jobs[0].parent, before, results


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_a_stopped_joblib_sweep_leaves_no_process_and_resumes_into_its_folder(tmp_path, sig):
    """Ctrl-C reaches the driver only (the pool's workers live in sessions of their own): joblib stops every worker
    with its processes, the driver says the resume command once and exits 130. After a SIGKILL of the driver its
    workers end their jobs themselves (framework/session/pool_worker.py)."""
    args = held_at([*STOPPABLE_SWEEP, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=single",
                    "trainer.max_steps=64", "trainer.seed=1,2,3,4"], step=8, runs="1_*")
    tag = uuid.uuid4().hex
    proc = _stop_sweep(args, tmp_path, sig, tag)
    sweep_dir, before, results = _stopped_state(tmp_path, proc, tag)
    again = _resume_args(proc, tmp_path, args, sweep_dir)
    assert "Traceback" not in (tmp_path / "train.err").read_text()

    out = check_ok(run_train(again, tmp_path, timeout=180, env=faults_env()))
    _assert_resumed_as_it_was_left(out, before, results)
    assert [(r["job"], r["status"]) for r in _summary_rows(sweep_dir)] == [(str(n), "ok") for n in range(4)]


def test_a_stopped_submitit_sweep_stops_its_tasks_and_resumes_into_its_folder(tmp_path):
    """Ctrl-C of a sweep of 2-task ddp jobs under submitit_local: every job's tasks end before the driver, which says
    the resume command once. Run again, rank 0 of the finished job tells its other task there is nothing to do (it
    waited for rank 0's payload before, so finished jobs trained again), the stopped job resumes."""
    args = held_at([*STOPPABLE_SWEEP, "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2",
                    "strategy=ddp", "trainer.max_steps=8,96"], step=8, runs="1_*")  # 96 steps: 3 epochs of 32
    tag = uuid.uuid4().hex
    proc = _stop_sweep(args, tmp_path, signal.SIGINT, tag)
    sweep_dir, before, results = _stopped_state(tmp_path, proc, tag)
    first_logs = set(walk(sweep_dir / ".submitit", "*_log.*"))

    again = check_ok(run_train(_resume_args(proc, tmp_path, args, sweep_dir), tmp_path, timeout=180,
                               env=faults_env()))
    logs = {p: p.read_text() for p in set(walk(sweep_dir / ".submitit", "*_log.*")) - first_logs}
    _assert_resumed_as_it_was_left("".join(text for p, text in logs.items() if p.name.endswith("_0_log.out")),
                                   before, results)
    assert not any("error" in text or "Traceback" in text for text in logs.values()), logs
    assert [(r["job"], r["status"]) for r in _summary_rows(sweep_dir)] == [("0", "ok"), ("1", "ok")]
    assert "sweep summary" in again


@pytest.mark.core
def test_optuna_gets_the_accuracy_and_a_failed_trial_does_not_stop_the_study(tmp_path):
    # The preset's study (TPE, seed 42), narrowed to one parameter: grad_accum=3 does not divide batch 64, so
    # those trials fail before training; the others train and their accuracy reaches Optuna.
    proc = run_train(["-m", "hparams_search=fashion_mnist_optuna", "hydra.sweeper.n_trials=3",
                      "optimizer.lr=0.002", "trainer.batch_size=64", "model=lenet", "trainer.grad_accum=choice(1,3)",
                      *[a for a in TINY if not a.startswith("trainer.batch_size")], "trainer.max_steps=8"],
                     tmp_path, timeout=300)
    assert "trainer.batch_size=64 is not allowed" in proc.stderr
    [sweep_dir] = {j.parent for j in run_dirs(tmp_path)}
    rows = _summary_rows(sweep_dir)
    assert len(rows) == 3 and {r["status"] for r in rows} == {"failed", "ok"}
    for row in rows:
        assert ("grad_accum=3" in row["overrides"]) == (row["status"] == "failed")
        assert Path(row["run_dir"]).name == f"{row['job']}_grad_accum={row['trainer.grad_accum']}"
    best = yaml.safe_load((sweep_dir / "optimization_results.yaml").read_text())
    assert best["best_params"]["trainer.grad_accum"] == 1
    assert round(best["best_value"], 4) == max(float(r["test_acc"]) for r in rows if r["status"] == "ok")
    assert proc.returncode == 1 and "1 sweep job(s) failed" in proc.stderr  # the sweep still says so




MARK = """
from pathlib import Path
from framework.callbacks.base import Callback


class Mark(Callback):
    def on_fit_start(self, state):
        (state.run_dir / f"ran_this_checkout_rank{state.rank}").touch()
"""


@pytest.mark.parametrize("strategy", ["ddp", "horovod", "submitit"])
def test_a_checkout_run_from_elsewhere_trains_its_own_code_in_every_worker(tmp_path, strategy):
    """`python <checkout>/train.py` from another folder, with another copy of the package installed (this repository,
    installed editable): every worker imports the checkout's code. A module only the checkout has shows it. Python
    3.11's forkserver (the worker template) and Horovod's runner both started workers that found the installed copy."""
    if strategy == "horovod":
        pytest.importorskip("horovod.torch", reason="the horovod extra (make test builds it)")
    checkout = tmp_path / "checkout"
    for name in ("framework", "conf"):
        shutil.copytree(REPO / name, checkout / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TRAIN, checkout / "train.py")
    (checkout / "framework" / "callbacks" / "only_in_this_checkout.py").write_text(MARK)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # submitit: a sweep's tasks are fresh interpreters started by submitit (2 tasks = the 2 ranks of one ddp job)
    how = (["-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "strategy=ddp"]
           if strategy == "submitit" else [f"strategy={strategy}"])
    proc = subprocess.run([sys.executable, str(checkout / "train.py"), *how, *TINY,
                           "trainer.max_steps=2", "+callbacks.mark._target_=framework.callbacks.only_in_this_checkout.Mark",
                           *pin_accelerator([])], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    check_ok(proc)
    [run_dir] = run_dirs(elsewhere)
    assert sorted(p.name for p in run_dir.glob("ran_this_checkout_rank*")) == ["ran_this_checkout_rank0",
                                                                             "ran_this_checkout_rank1"]
