"""How a process was started, decided once (framework/session/): which situation an environment and a composed Hydra
config make, and what each situation does when its run is refused, stopped, finished before or failed. In this
process, in seconds: environments are plain dicts (or this process's, patched), Hydra's config is composed from
conf/ as the driver's is; the exits are caught as SystemExit. The process tests (test_bad_inputs, test_torchrun,
test_outer_launchers, test_launchers, test_signals, test_sweep, test_horovodrun) check the same exit codes on real
processes."""
import contextlib
import json
import signal
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from framework import cli
from framework.common.errors import ConfigError
from framework.launch.elastic import WorkersFailed
from framework.results.result_file import write_result
from framework.run import run
from framework.session import situations
from framework.session.detect import situation, sweep_driver, worker_ranks
from framework.session.environment import HOROVOD, TORCH, Ranks, _ranks, read_ranks
from framework.session.situations import (
    Direct,
    Follower,
    OuterRank0,
    PoolJob,
    SchedulerRank0,
    SweepJob,
    SweepUnderRanks,
)
from framework.strategies import strategies_for_outer_kind
from support.processes import REPO, pin_accelerator
from support.run_files import walk

TORCHRUN = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
HOROVODRUN = {"HOROVOD_RANK": "1", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_SIZE": "2"}
RANK0, RANK1 = Ranks(TORCH, 0, 0, 2, 2), Ranks(TORCH, 1, 1, 2, 2)
SUBMITIT0 = Ranks(TORCH, 0, 0, 2, 2, scheduler="local", submitit=True)
SUBMITIT1 = Ranks(TORCH, 1, 1, 2, 2, scheduler="local", submitit=True)


COMMAND = ["train.py", "-m", "trainer.seed=1,2"]  # the command line these processes were started with


@pytest.fixture(autouse=True)
def _command_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", COMMAND)


def hydra_config(tmp_path: Path, *overrides: str, multirun: bool = False, pin: bool = False):
    """Hydra's config of a job as the driver has it: composed from conf/, with the folder Hydra's run gives it
    (pin: on this test's accelerator, for a job that runs the driver's checks)."""
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        mode = ["hydra.mode=MULTIRUN"] if multirun else []
        chosen = pin_accelerator(list(overrides)) if pin else list(overrides)
        cfg = compose("config", overrides=[*chosen, *mode], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(tmp_path / ("sweep/0_job" if multirun else "run"))
        cfg.hydra.sweep.dir = str(tmp_path / "sweep")
        cfg.hydra.job.num = 0
    Path(cfg.hydra.runtime.output_dir).mkdir(parents=True)
    return cfg


# ---- which situation ------------------------------------------------------------------------------------------

def test_the_environment_says_whose_ranks_these_are():
    assert read_ranks({}) is None
    assert read_ranks({"RANK": "0", "WORLD_SIZE": "2"}) is None  # an sbatch script's: no LOCAL_RANK, no rank
    assert read_ranks(TORCHRUN) == RANK0
    assert read_ranks({**TORCHRUN, "LOCAL_WORLD_SIZE": "1"}).local_world_size == 1  # two nodes of one
    assert read_ranks(HOROVODRUN) == Ranks(HOROVOD, 1, 1, 2, 2)
    assert (RANK0.started_by, Ranks(HOROVOD, 0, 0, 2, 2).started_by, SUBMITIT0.started_by) == (
        "torchrun", "horovodrun", "submitit_local tasks")


def test_a_process_reads_its_ranks_once(monkeypatch):
    for name, value in TORCHRUN.items():
        monkeypatch.setenv(name, value)
    first = _ranks()
    monkeypatch.setenv("RANK", "1")  # whatever changes later, the process is what it was started as
    assert _ranks() is first and first.rank == 0


def test_a_started_worker_is_handed_the_ranks_its_starter_left_and_none_is_an_error(monkeypatch):
    for name in [*TORCHRUN, "SLURM_STEP_NUM_TASKS", "SUBMITIT_EXECUTOR", *HOROVODRUN]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="its starter left no ranks"):
        worker_ranks()
    _ranks.cache_clear()  # a process reads its ranks once; this test plays another process
    for name, value in HOROVODRUN.items():
        monkeypatch.setenv(name, value)
    assert worker_ranks() == Ranks(HOROVOD, 1, 1, 2, 2)


@pytest.mark.parametrize("mode,launcher,outer,expected", [
    ("run", None, None, Direct),
    ("run", None, RANK0, OuterRank0),
    ("run", None, RANK1, Follower),
    ("multirun", None, None, SweepJob),
    ("multirun", "joblib", None, PoolJob),
    ("multirun", None, SUBMITIT0, SchedulerRank0),
    ("multirun", None, SUBMITIT1, Follower),
    ("multirun", None, RANK0, SweepUnderRanks),  # torchrun ... train.py -m
])
def test_each_way_of_starting_is_one_situation(tmp_path, mode, launcher, outer, expected):
    overrides = [f"hydra/launcher={launcher}", "hydra.launcher.n_jobs=2"] if launcher else []
    session = situation(hydra_config(tmp_path, *overrides, multirun=mode == "multirun").hydra, outer)
    assert type(session) is expected
    assert session.follows == (expected is Follower)
    assert session.leads == (expected in (OuterRank0, SchedulerRank0, SweepUnderRanks))
    assert session.in_sweep == (expected in (SweepJob, PoolJob, SchedulerRank0))
    assert session.multirun == (mode == "multirun")  # what verify.py refuses, without reading Hydra's mode itself
    if expected is PoolJob:
        assert session.n_jobs == 2
    if expected is not Follower:
        assert session.run_dir == Path(tmp_path / ("sweep/0_job" if mode == "multirun" else "run"))


def test_before_hydra_the_command_knows_only_its_ranks():
    assert type(situation(None, None)) is Direct and situation(None, None).job is None
    assert type(situation(None, RANK0)) is OuterRank0
    follower = situation(None, RANK1)
    assert type(follower) is Follower and not follower.in_sweep_task


# ---- what each situation does ---------------------------------------------------------------------------------

@pytest.fixture
def told(monkeypatch):
    """What rank 0 told the other ranks (framework/session/channel.py), and exit_now as a SystemExit: a follower
    leaves with os._exit, which would end this test process."""
    said = []
    monkeypatch.setattr(situations, "tell_followers", lambda ranks, **message: said.append(message))
    monkeypatch.setattr(situations, "told_followers", lambda: bool(said))

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(situations, "exit_now", exit_now)
    return said


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """One of each situation (composed once for this module: each composition costs a second here)."""
    tmp_path = tmp_path_factory.mktemp("sessions")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", COMMAND)
        return _one_of_each(tmp_path)


def _one_of_each(tmp_path):
    run_cfg = hydra_config(tmp_path / "a", "trainer.seed=3").hydra
    sweep_cfg = hydra_config(tmp_path / "b", multirun=True).hydra
    pool_cfg = hydra_config(tmp_path / "c", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", multirun=True).hydra
    return {
        "direct": situation(run_cfg, None),
        "torchrun rank 0": situation(run_cfg, RANK0),
        "torchrun rank 1": situation(None, RANK1),
        "srun rank 1": situation(None, Ranks(TORCH, 1, 1, 2, 2, scheduler="slurm")),
        "sweep job": situation(sweep_cfg, None),
        "pool job": situation(pool_cfg, None),
        "submitit rank 0": situation(sweep_cfg, SUBMITIT0),
        "submitit rank 1": situation(sweep_cfg, SUBMITIT1),
    }


# situation: (exit code of a refusal, of a failure while training (None: the job returns None, the sweep goes on),
# whether it says the error, whether it tells the other ranks)
FAILING = {
    "direct": (2, 1, True, False),
    "torchrun rank 0": (2, 1, True, True),
    "torchrun rank 1": (2, 1, False, False),  # rank 0 said it; torchrun's ranks share one console
    "srun rank 1": (2, 1, True, False),  # each task has a log of its own
    "sweep job": (None, None, True, False),
    "pool job": (None, None, True, False),
    "submitit rank 0": (None, None, True, True),
    "submitit rank 1": (None, None, True, False),
}


@pytest.mark.parametrize("name", FAILING)
def test_a_refusal_exits_2_and_a_failure_1_said_once_everywhere_but_in_a_sweep(sessions, capsys, told, name):
    refused, failed, says, tells = FAILING[name]
    session = sessions[name]
    for exc, code in ((ConfigError("trainer.batch_size=0 is not allowed"), refused),
                      (WorkersFailed("worker rank 1 failed (exit code 1): RuntimeError"), failed)):
        told.clear()
        if code is None:
            assert session.fail(exc) is None
        else:
            with pytest.raises(SystemExit) as ended:
                session.fail(exc)
            assert ended.value.code == code
        err = capsys.readouterr().err
        assert err == (f"error: {exc}\n" if says else "")
        assert told == ([{"refusal": str(exc)}] if tells else [])


def test_rank_0_tells_the_others_once(sessions, told):
    session = sessions["torchrun rank 0"]
    session.hand_off("the payload")
    with pytest.raises(SystemExit):  # a failure while training: the others train, and end with their group
        session.fail(WorkersFailed("rank 1 failed"))
    assert told == [{"payload": "the payload"}]


@pytest.mark.parametrize("follower,waits", [(RANK1, False), (Ranks(HOROVOD, 1, 1, 2, 2), True)])
def test_a_rank_refused_by_rank_0_under_horovodrun_waits_for_horovodrun_to_stop_it(told, monkeypatch, capsys,
                                                                                     follower, waits):
    """horovodrun stops relaying every rank's output once one exits non-zero: a rank > 0 that ended before rank 0
    cut rank 0's `error:` line off mid-word. torchrun's ranks write to the console themselves: no wait."""
    slept = []
    monkeypatch.setattr(situations.time, "sleep", slept.append)
    with pytest.raises(SystemExit) as ended:
        situation(None, follower).refused("trainer.batch_size=0 is not allowed")
    assert ended.value.code == 2 and capsys.readouterr().err == ""
    assert slept == ([situations.RANK0_END_WAIT_S] if waits else [])


def test_a_strategy_for_other_workers_is_refused_naming_those_for_the_launchers_workers():
    """Every strategy whose class trains with the ranks a launcher started is named, however its options
    interpolate the rest of the config (horovod's: ${trainer.grad_accum})."""
    assert strategies_for_outer_kind(HOROVOD) == ["horovod"]
    assert {"ddp", "fsdp", "deepspeed", "tp", "pp"} <= set(strategies_for_outer_kind(TORCH))
    assert {"horovod", "dp", "single", "auto"}.isdisjoint(strategies_for_outer_kind(TORCH))


# situation: (exit code, whether it prints the command that resumes, and which)
STOPPING = {
    "direct": (128 + signal.SIGTERM, "python train.py trainer.seed=3 hydra.run.dir={run_dir} trainer.resume=auto"),
    "torchrun rank 0": (128 + signal.SIGTERM, "python train.py trainer.seed=3 hydra.run.dir={run_dir} "
                                              "trainer.resume=auto"),
    "torchrun rank 1": (128 + signal.SIGTERM, None),  # rank 0 says it
    "sweep job": (128 + signal.SIGTERM, "python train.py -m trainer.seed=1,2 hydra.sweep.dir={sweep_dir}"),
    "submitit rank 0": (128 + signal.SIGTERM, "python train.py -m trainer.seed=1,2 hydra.sweep.dir={sweep_dir}"),
    "pool job": (None, None),  # its driver says the command, once for the sweep
}


@pytest.mark.parametrize("name", STOPPING)
def test_a_stop_says_what_is_kept_and_how_to_resume_then_exits_128_plus_n(sessions, capsys, told, name):
    code, command = STOPPING[name]
    session = sessions[name]
    if code is None:
        assert session.stopped(signal.SIGTERM, "the last complete checkpoint is X (step 4)") is None
    else:
        with pytest.raises(SystemExit) as ended:
            session.stopped(signal.SIGTERM, "the last complete checkpoint is X (step 4)")
        assert ended.value.code == code
    err = capsys.readouterr().err
    if name != "torchrun rank 1":
        assert "stopped by SIGTERM; all workers are stopped; the last complete checkpoint is X (step 4)." in err
    resume = [line.removeprefix("To resume: ") for line in err.splitlines() if line.startswith("To resume: ")]
    if command is None:
        assert resume == []
    else:
        assert resume == [command.format(run_dir=session.job.run_dir, sweep_dir=session.job.sweep_dir)]
    assert told == []


def test_a_sweeps_resume_command_is_the_one_that_started_it(sessions, capsys):
    session = sessions["sweep job"]
    sweep_dir = session.job.sweep_dir
    (sweep_dir / "provenance.json").write_text(json.dumps(
        {"command": {"argv": ["train.py", "-m", "trainer.seed=1,2", "hydra.sweep.dir=old"]}}))
    try:
        with pytest.raises(SystemExit):
            session.stopped(signal.SIGINT, "no checkpoint had been written yet")
    finally:
        (sweep_dir / "provenance.json").unlink()
    assert f"To resume: python train.py -m trainer.seed=1,2 hydra.sweep.dir={sweep_dir}" in capsys.readouterr().err


def test_a_sweeps_driver_stopped_by_ctrl_c_says_the_command_once(tmp_path, capsys):
    assert sweep_driver() is None  # no sweep runs: Ctrl-C keeps Python's own exit
    HydraConfig.instance().set_config(hydra_config(tmp_path, multirun=True))
    try:
        driver = sweep_driver()
        with pytest.raises(SystemExit) as ended:
            driver.stopped(signal.SIGINT)
    finally:
        HydraConfig.instance().cfg = None
    assert ended.value.code == 128 + signal.SIGINT
    assert capsys.readouterr().err.count("To resume: python ") == 1


@pytest.mark.parametrize("name", ["sweep job", "submitit rank 0"])
def test_a_job_finished_before_is_said_and_the_other_ranks_have_nothing_to_do(sessions, capsys, told, name):
    session = sessions[name]
    session.finished_before("its result.json says acc 0.8125")
    assert capsys.readouterr().out == (f"job 0 finished before in {session.run_dir}: not trained again; its "
                                       "result.json says acc 0.8125\n")
    assert told == ([{"finished": str(session.run_dir)}] if session.leads else [])


# ---- the driver's story, in this process ----------------------------------------------------------------------

def _run_as(monkeypatch, hydra_cfg, outer):
    """framework.run.run for this Hydra config, as a process with these ranks would run it."""
    HydraConfig.instance().set_config(hydra_cfg)
    try:
        job_cfg = hydra_cfg.copy()
        with open_dict(job_cfg):
            del job_cfg["hydra"]
        return run(job_cfg, situation(HydraConfig.get(), outer))
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize("outer,multirun,code", [(None, False, 2), (RANK0, False, 2), (None, True, None),
                                                 (SUBMITIT0, True, None), (RANK0, True, 2)])
def test_the_driver_refuses_a_bad_value_before_any_worker_in_every_situation(tmp_path, capsys, told, monkeypatch,
                                                                              outer, multirun, code):
    cfg = hydra_config(tmp_path, "strategy=ddp", "trainer.batch_size=0", multirun=multirun, pin=True)
    if code is None:
        assert _run_as(monkeypatch, cfg, outer) is None
    else:
        with pytest.raises(SystemExit) as ended:
            _run_as(monkeypatch, cfg, outer)
        assert ended.value.code == code
    [line] = capsys.readouterr().err.splitlines()
    if outer is RANK0 and multirun:
        assert line == ("error: -m/--multirun is not allowed under torchrun; run the sweep without it (for sweeps "
                        "on SLURM: python train.py -m hydra/launcher=slurm ...)")
    else:
        assert line.startswith("error: trainer.batch_size=0 is not allowed: expected an integer >= 1")
    assert told == ([{"refusal": line.removeprefix("error: ")}] if outer is not None else [])
    assert not walk(tmp_path, "resolved_config.yaml"), "nothing of a run was written"


def test_a_sweep_run_again_reports_a_finished_job_and_refuses_one_of_another_config(tmp_path, capsys, told,
                                                                                     monkeypatch):
    cfg = hydra_config(tmp_path, "trainer.max_steps=3", multirun=True, pin=True)
    run_dir = Path(cfg.hydra.runtime.output_dir)
    job_cfg = cfg.copy()
    with open_dict(job_cfg):
        del job_cfg["hydra"]
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(job_cfg, resolve=True)), run_dir / "resolved_config.yaml")
    write_result(run_dir, {"objective": "acc", "test_acc": 0.75})
    assert _run_as(monkeypatch, cfg, SUBMITIT0) == 0.75
    assert "job 0 finished before" in capsys.readouterr().out and told == [{"finished": str(run_dir)}]

    told.clear()
    again = hydra_config(tmp_path / "other", "trainer.max_steps=4", multirun=True, pin=True)
    other_dir = Path(again.hydra.runtime.output_dir)
    for name in ("resolved_config.yaml", "result.json"):
        (other_dir / name).write_text((run_dir / name).read_text())
    assert _run_as(monkeypatch, again, SUBMITIT0) is None  # refused; the sweep goes on
    [line] = capsys.readouterr().err.splitlines()
    assert "finished there with another config (trainer.max_steps differ)" in line
    assert told == [{"refusal": line.removeprefix("error: ")}]


# ---- the command, before and around Hydra ---------------------------------------------------------------------

def test_a_bad_local_rank_argument_is_a_refusal(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--local_rank=x", "strategy=ddp"])
    with pytest.raises(SystemExit) as ended:
        cli._main()
    assert ended.value.code == 2
    assert capsys.readouterr().err == ("error: --local_rank='x' is not allowed: expected a local rank (an integer >= "
                                       "0), as torch.distributed.launch and DeepSpeed's launcher pass it\n")


def test_a_value_hydra_refuses_under_torchrun_is_said_once_and_told_to_the_other_ranks(tmp_path, monkeypatch, capsys,
                                                                                       told):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", "trainer.epochs=abc"])
    monkeypatch.setattr(cli, "detect", lambda: situation(None, RANK0))
    with pytest.raises(SystemExit) as ended:
        cli._main()
    assert ended.value.code == 2
    line = "trainer.epochs='abc' is not allowed: expected an integer >= 1"
    assert capsys.readouterr().err == f"error: {line}\n"
    assert told == [{"refusal": line}]
    assert not (tmp_path / "outputs").exists()


def test_an_output_folder_that_cannot_be_made_under_torchrun_is_said_once_and_told_to_the_other_ranks(
        tmp_path, monkeypatch, capsys, told):
    """The run folder is claimed inside Hydra's callbacks, where Hydra only warns about an exception: the refusal
    reaches the command, whose session says it and tells the ranks that wait for rank 0."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["train.py", "hydra.run.dir=/proc/no/such/run"])
    monkeypatch.setattr(cli, "detect", lambda: situation(None, RANK0))
    with pytest.raises(SystemExit) as ended:
        cli._main()
    assert ended.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: hydra.run.dir=/proc/no/such/run is not allowed: the output folder cannot be "
                           "created or written"), line
    assert told == [{"refusal": line.removeprefix("error: ")}]


# ---- eval.py and sample.py: direct runs, refused like train.py ------------------------------------------------

@pytest.mark.parametrize("command,argv,said", [
    ("eval_main", ["eval.py", "ckpt_path=no/such/run"], "error: ckpt_path=no/such/run is not allowed: no such file"),
    ("eval_main", ["eval.py"], "error: ckpt_path is missing: name a run folder, weights file or checkpoint"),
    ("eval_main", ["eval.py", "ckpt_path=."], "error: ckpt_path=. is not allowed: it holds no valid checkpoint"),
    ("sample_main", ["sample.py"], "error: ckpt_path is missing: name a run folder or a weights file"),
    ("eval_main", ["eval.py", "ckpt_path=x", "no_such_key=1"], "error: Could not override 'no_such_key'"),
    ("sample_main", ["sample.py", "ckpt_path=no/such/run"], "error: ckpt_path=no/such/run is not allowed: no such"),
    ("sample_main", ["sample.py", "ckpt_path=x", "no_such_key=1"], "error: Could not override 'no_such_key'"),
    ("eval_main", ["eval.py", "ckpt_path=x", "hydra.run.dir=/proc/no/such/run"],
     "error: hydra.run.dir=/proc/no/such/run is not allowed: the output folder cannot be created or written"),
])
def test_eval_and_sample_refusals_exit_2_with_one_line(tmp_path, monkeypatch, capsys, command, argv, said):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(cli, "quick_exit", contextlib.nullcontext)  # its exit handler would end pytest's process
    with pytest.raises(SystemExit) as ended:
        getattr(cli, command)()
    assert ended.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(said), line
