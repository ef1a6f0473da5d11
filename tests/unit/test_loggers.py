"""The logger group in this process: logger=mlflow and logger=wandb without their extras are one line each, and so is
a tracking store MLflow will not open; the logger list composes; W&B's run id and sweep group kept in the folders; a bad W&B mode refused by the driver. The
loggers' real stores and files: tests/runs/test_loggers.py."""
import csv
import sys

import pytest
from omegaconf import OmegaConf

from framework.common.errors import ConfigError
from framework.results.run_scalars import run_scalars
from support.driver import command_in_process, composed, driver_says
from support.processes import USER_CODE


@pytest.mark.parametrize("logger", ["mlflow", "wandb"])
def test_without_the_extra_a_logger_is_one_line_naming_its_install(monkeypatch, logger):
    from framework.callbacks import mlflow_log, wandb_log

    monkeypatch.setitem(sys.modules, logger, None)  # how Python says "not installed": find_spec gives None
    callback = {"mlflow": mlflow_log.MLflowLog, "wandb": wandb_log.WandbLog}[logger]
    with pytest.raises(ConfigError, match=rf"^logger={logger} needs {logger}, an optional extra that is not installed; "
                                          rf"install it with `pip install 'hydra-dist\[{logger}\]'` \(or `make setup`"):
        callback()


def test_a_tracking_store_mlflow_will_not_open_is_one_line_naming_the_key():
    """MLflow's own refusal of a store (its file store since 3.x, a scheme it does not know) was rank 0's traceback."""
    pytest.importorskip("mlflow", reason="the mlflow extra (make test installs it)")
    from framework.results.mlflow_tracking import client_for

    with pytest.raises(ConfigError) as refused:
        client_for("nosuchscheme://store")
    assert str(refused.value).startswith("callbacks.mlflow.tracking_uri=nosuchscheme://store is not allowed: MLflow "
                                         "cannot open it (")
    assert "\n" not in str(refused.value)


def test_a_list_of_loggers_composes_every_one_and_its_sweep_callback():
    cfg = composed("logger=[tensorboard,wandb,csv]", hydra=True)
    assert {"tensorboard", "wandb", "csv"} <= set(cfg.callbacks)
    assert cfg.callbacks.wandb._target_ == "framework.callbacks.wandb_log.WandbLog"
    callbacks = list(cfg.hydra.callbacks)
    # the sweep's group is named after the callback that claims the sweep folder
    assert callbacks.index("wandb_sweep") > callbacks.index("run_folder")


def test_the_wandb_run_id_is_kept_in_the_run_folder_and_a_sweeps_group_in_its_folder(tmp_path):
    from framework.results.wandb_sweep import WandbSweep
    from framework.results.wandb_tracking import run_id, sweep_group

    job = tmp_path / "sweep" / "0_lr=0.1"
    job.mkdir(parents=True)
    first = run_id(job)
    assert run_id(job) == first and (job / "wandb_run_id").read_text() == first and len(first) == 8
    assert run_id(tmp_path) != first  # another run folder, another W&B run
    assert sweep_group(job) is None
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweep")}}})
    WandbSweep().on_multirun_start(config)
    assert sweep_group(job) == "sweep"  # the sweep folder's name
    (tmp_path / "sweep" / "wandb_group").write_text("kept")  # the same sweep again keeps its group
    WandbSweep().on_multirun_start(config)
    assert sweep_group(job) == "kept"


def test_a_bad_wandb_mode_is_refused_by_the_driver(tmp_path):
    pytest.importorskip("wandb", reason="the wandb extra (make test installs it)")
    assert driver_says(["dataset=synthetic", "logger=wandb", "callbacks.wandb.mode=cloud"], tmp_path) == (
        "callbacks.wandb.mode='cloud' is not allowed: expected null (W&B's own: WANDB_MODE, else online), online, "
        "offline or disabled")


def test_a_callbacks_own_scalar_reaches_every_logger_at_the_next_log_boundary(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(USER_CODE))
    run = tmp_path / "run"
    code, out, err = command_in_process("main", [
        "train.py", "logger=[tensorboard,csv]", "+callbacks.square._target_=scalar_logging.StepSquared",
        "allowed_targets=[scalar_logging.*]", "dataset=synthetic", "dataset.train_size=256", "dataset.test_size=64",
        "strategy=single", "trainer.max_steps=6", "trainer.batch_size=32", "trainer.log_every_n_steps=2",
        "trainer.progress_bar=false", "trainer.keep_checkpoints=0", f"hydra.run.dir={run}"], tmp_path, monkeypatch,
        capsys)
    assert code == 0, out + err
    assert run_scalars(run)["custom/step_squared"] == {2: 4.0, 4: 16.0, 6: 36.0}  # TensorBoard's own reader
    with open(run / "metrics.csv", newline="") as f:
        written = {int(row["step"]): float(row["value"]) for row in csv.DictReader(f)
                   if row["metric"] == "custom/step_squared"}
    assert written == {2: 4.0, 4: 16.0, 6: 36.0}
