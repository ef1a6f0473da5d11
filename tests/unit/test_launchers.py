"""Launchers as Hydra config, in this process: how a SLURM task reads its ranks and port from the scheduler's
variables (and an sbatch script is no rank), the slurm preset and the sbatch file submitit would write for it, and
how joblib's parallel slots share the GPUs and cores. The launchers' real jobs: tests/runs/test_launchers.py."""
import os

import pytest
import yaml
from omegaconf import OmegaConf

from framework.common.errors import ConfigError
from framework.launch.template import starts_workers_from_template
from framework.session.environment import HOROVOD, Ranks, _ranks, take_local_rank_argument
from support.driver import composed, driver_says
from support.processes import TINY

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _ranks_adopted(monkeypatch, env: dict) -> list[str]:
    """What a process started with `env` (and no launcher's or scheduler's variables of this one) reads as its ranks:
    whether it is one of several, and torch's variables it exported."""
    for name in [k for k in os.environ if k.startswith(("SLURM_", "SUBMITIT_"))] + list(RANK_VARIABLES):
        monkeypatch.setenv(name, "")  # put back as they were (absent or not) when the test ends
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _ranks.cache_clear()
    adopted = _ranks() is not None
    _ranks.cache_clear()
    return [str(adopted), *(str(os.environ.get(k)) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                               "MASTER_PORT"))]


def test_srun_tasks_of_one_job_agree_on_the_port_and_an_sbatch_script_is_no_rank(monkeypatch):
    job = {"SLURM_JOB_ID": "9001", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[07-08]"}
    step = {**job, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}
    tasks = [_ranks_adopted(monkeypatch, {**step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r % 2),
                                          "SLURM_NODEID": str(r // 2)}) for r in range(4)]
    assert [t[:4] for t in tasks] == [["True", str(r), "4", str(r % 2)] for r in range(4)]
    assert {(t[4], t[5]) for t in tasks} == {("gpu07", tasks[0][5])}  # rank 0's node, one port for all
    other_job = _ranks_adopted(monkeypatch, {**step, "SLURM_JOB_ID": "9002", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})
    assert other_job[5] != tasks[0][5]
    # The batch script itself (SLURM_NTASKS=4, SLURM_PROCID=0, no srun step) starts its own workers.
    assert _ranks_adopted(monkeypatch, {**job, "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})[:2] == ["False", "None"]


def test_slurm_preset_asks_for_one_task_per_gpu(tmp_path):
    cfg = composed("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4", "hydra.launcher.nodes=2",
                   "hydra.launcher.partition=gpu", hydra=True)
    launcher = yaml.safe_load(OmegaConf.to_yaml(cfg.hydra.launcher, resolve=True))
    assert launcher["_target_"].endswith("SlurmLauncher")
    assert (launcher["tasks_per_node"], launcher["gpus_per_node"], launcher["nodes"]) == (4, 4, 2)

    # The sbatch file that submitit's SLURM executor writes for these settings (nothing is submitted; the
    # executor itself refuses to start without srun on the machine, so its file writer is called directly).
    from submitit.slurm.slurm import _make_sbatch_string

    sbatch = _make_sbatch_string(command="python -m submitit.core._submit x", folder=str(tmp_path), job_name="train",
                                 ntasks_per_node=launcher["tasks_per_node"], gpus_per_node=launcher["gpus_per_node"],
                                 nodes=launcher["nodes"], partition=launcher["partition"],
                                 cpus_per_task=launcher["cpus_per_task"], time=launcher["timeout_min"])
    for line in ("#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4", "#SBATCH --nodes=2",
                 "#SBATCH --partition=gpu"):
        assert line in sbatch


def test_joblib_slots_split_gpus_and_cores_and_refuse_more_jobs_than_gpus():
    from framework.common.errors import ConfigError
    from framework.session.slots import share

    gpus, cores = ["0", "1", "2", "3"], list(range(8))
    assert [(s.gpus, s.cores) for s in (share(k, 2, gpus, cores) for k in range(2))] == [
        (("0", "1"), (0, 1, 2, 3)), (("2", "3"), (4, 5, 6, 7))]
    assert share(3, 4, gpus, cores).gpus == ("3",)
    assert share(1, 2, [], [0, 1]).cores == (1,) and share(1, 2, [], [0, 1]).gpus == ()
    with pytest.raises(ConfigError, match="hydra.launcher.n_jobs=8 is not allowed with 4 GPU"):
        share(0, 8, gpus, cores)


HOROVODRUN = Ranks(HOROVOD, rank=0, local_rank=0, world_size=2, local_world_size=2)


@pytest.mark.parametrize("args,message", [
    (["strategy=ddp"], "strategy=ddp is not allowed under horovodrun: the launcher already started several workers; "
                       "use strategy=horovod"),
    (["strategy=auto"], "strategy=auto is not allowed under horovodrun: name the engine the workers were started for, "
                        "strategy=horovod"),
])
def test_a_strategy_for_other_workers_is_refused_under_horovodrun(tmp_path, args, message):
    """The driver of rank 0 under horovodrun (its ranks as the session reads them); horovodrun's own start and every
    rank's exit: tests/runs/test_horovodrun.py."""
    pytest.importorskip("horovod.torch")
    line = driver_says([*args, *TINY], tmp_path, outer=HOROVODRUN)
    assert message in line, line


def test_the_local_rank_argument_is_taken_out_in_every_spelling(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "")  # put back as it was (absent or not) when the test ends: the call sets it
    monkeypatch.delenv("LOCAL_RANK")
    assert take_local_rank_argument(["--local-rank=1", "strategy=ddp"]) == ["strategy=ddp"]
    assert os.environ["LOCAL_RANK"] == "1"
    assert take_local_rank_argument(["a=1", "--local_rank", "0", "b=2"]) == ["a=1", "b=2"]
    with pytest.raises(ConfigError, match="--local_rank='x' is not allowed: expected a local rank"):
        take_local_rank_argument(["--local_rank=x"])


@pytest.mark.parametrize("strategy,early", [("ddp", True), ("fsdp", True), ("hsdp", True), ("tp", True), ("pp", True),
                                            ("auto", False), ("single", False), ("deepspeed", False)])
def test_the_workers_template_starts_before_the_typing_for_a_mesh_preset_but_not_for_auto(strategy, early):
    """strategy=auto composes as ddp's node (its _target_ too); without GPUs it chooses single, and the template
    started for it imported torch beside the driver for nothing: the README's first run took 1.6x as long on 2 busy
    cores (measured). auto's ddp starts it after the typing (Starter.warm_up), as deepspeed's does."""
    assert starts_workers_from_template(composed(f"strategy={strategy}").strategy) is early
