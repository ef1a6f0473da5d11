"""The logger group: TensorBoard (default), CSV, MLflow and W&B, alone or together. Real runs; the CSV is compared
with TensorBoard's own reader, the MLflow store is read back with MLflow's own client (a sweep: a parent run and its
jobs as children, with params, per-step metrics, per-rank throughput and artifacts), W&B's offline files with W&B's
own reader (support/wandb_files.py: a sweep's jobs in the sweep's group with TensorBoard's tags and values, a ddp run
logged per rank, a failed run resumed into the same W&B run, no W&B process left behind)."""
import csv
import uuid

import pytest

from support.processes import TINY, check_ok, gone_within, run_train
from support.run_files import read_scalars, run_dirs

SHORT = [*TINY, "trainer.max_steps=8", "trainer.epochs=1"]
RUN = [*SHORT, "strategy=single"]


def test_csv_holds_what_tensorboard_holds(tmp_path):
    check_ok(run_train([*RUN, "logger=[tensorboard,csv]"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    from_csv = {}
    for row in rows:
        from_csv.setdefault(row["metric"], []).append((int(row["step"]), float(row["value"])))
    tensorboard = read_scalars(run_dir)
    for tag in ("loss/train", "throughput/samples_per_sec/rank0", "loss/val", "acc/val", "lr"):
        assert [s for s, _ in from_csv[tag]] == [s for s, _ in tensorboard[tag]], tag
        assert [v for _, v in from_csv[tag]] == pytest.approx([v for _, v in tensorboard[tag]], rel=1e-6), tag


def test_csv_alone_writes_no_event_file(tmp_path):
    check_ok(run_train([*RUN, "logger=csv"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    assert (run_dir / "metrics.csv").is_file() and not list(run_dir.glob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def mlflow_client():
    pytest.importorskip("mlflow", reason="the mlflow extra (make test installs it)")
    from mlflow.tracking import MlflowClient

    return MlflowClient


def _runs(client_class, store):
    client = client_class(tracking_uri=f"sqlite:///{store}")
    [experiment] = [e for e in client.search_experiments() if e.name == "hydra-dist"]
    return client, client.search_runs([experiment.experiment_id])


def test_an_mlflow_sweep_is_a_parent_with_its_jobs_as_children(tmp_path, mlflow_client):
    store = tmp_path / "store.db"
    out = check_ok(run_train(["-m", "strategy=single,ddp", *SHORT, "logger=mlflow",
                              f"callbacks.mlflow.tracking_uri=sqlite:///{store}"], tmp_path, timeout=400))
    client, runs = _runs(mlflow_client, store)
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2, out
    [sweep_dir] = {j.parent for j in run_dirs(tmp_path)}
    assert parent.data.tags["sweep_dir"] == str(sweep_dir) and parent.info.status == "FINISHED"
    assert {"summary.md", "summary.csv"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["trainer.max_steps"] == "8" and "model._target_" in child.data.params
        losses = client.get_metric_history(child.info.run_id, "loss/train")
        assert [m.step for m in losses] == [4, 8] and all(m.value > 0 for m in losses)
        assert 0 < child.data.metrics["test_acc"] <= 1
        assert {"resolved_config.yaml"} <= {a.path for a in client.list_artifacts(child.info.run_id)}
        ranks = 2 if child.data.params["strategy.name"] == "ddp" else 1
        for rank in range(ranks):
            assert client.get_metric_history(child.info.run_id, f"throughput/samples_per_sec/rank{rank}")
        assert not client.get_metric_history(child.info.run_id, f"throughput/samples_per_sec/rank{ranks}")
    assert not list(tmp_path.glob("mlruns*")), "no MLflow folder in the working directory"


def test_a_resumed_run_goes_on_in_the_same_mlflow_run(tmp_path, mlflow_client):
    store = tmp_path / "store.db"
    args = [*TINY, "strategy=single", "trainer.max_steps=12", "trainer.epochs=1", "trainer.checkpoint_every_n_steps=4",
            "logger=mlflow", f"callbacks.mlflow.tracking_uri=sqlite:///{store}"]
    assert run_train(args, tmp_path, faults="raise_after_step:6:0").returncode != 0
    client, [failed] = _runs(mlflow_client, store)
    assert failed.info.status == "FAILED"
    [run_dir] = run_dirs(tmp_path)
    check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], tmp_path))
    client, [run] = _runs(mlflow_client, store)
    assert run.info.run_id == failed.info.run_id and run.info.status == "FINISHED"
    assert sorted({m.step for m in client.get_metric_history(run.info.run_id, "loss/train")}) == [4, 8, 12]


# ---- logger=wandb ---------------------------------------------------------------------------------------------------
# offline (nothing leaves the machine); W&B's files in each run folder (WANDB_DIR emptied: the run folder is the default)
WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_DIR": "", "WANDB_SILENT": "true"}


@pytest.fixture(scope="module")
def wandb_runs():
    pytest.importorskip("wandb", reason="the wandb extra (make test installs it)")
    from support.wandb_files import wandb_runs

    return wandb_runs


def test_a_wandb_sweep_groups_its_jobs_and_logs_what_tensorboard_logs(runs, wandb_runs):
    sweep = runs.train(["-m", "strategy=single,ddp", *SHORT, "logger=[tensorboard,wandb]"], env=WANDB_ENV,
                       timeout=600).ok()
    [sweep_dir] = {job.parent for job in sweep.jobs}
    for job in sweep.jobs:
        [run] = wandb_runs(job)  # one W&B run per training run, in its run folder
        assert run.run_id == (job / "wandb_run_id").read_text() and run.exit_code == 0
        assert run.run["run_group"] == sweep_dir.name and run.run["display_name"] == f"{sweep_dir.name}/{job.name}"
        assert run.config["hydra_dist"] == {"run_dir": str(job), "sweep": sweep_dir.name, "rank": 0}
        assert run.config["trainer"]["max_steps"] == 8 and run.config["model"]["_target_"]
        logged, tensorboard = run.history(), read_scalars(job)
        ranks = 2 if run.config["strategy"]["name"] == "ddp" else 1
        expected = {"loss/train", "loss/val", "acc/val", "lr", "throughput/samples_per_sec",
                    *(f"{tag}/rank{r}" for r in range(ranks) for tag in ("throughput/samples_per_sec", "loss/train"))}
        assert expected <= set(logged) and f"throughput/samples_per_sec/rank{ranks}" not in logged
        for tag, points in tensorboard.items():
            if tag.startswith("hparam/"):
                continue
            assert [s for s, _ in logged[tag]] == [s for s, _ in points], tag
            assert [v for _, v in logged[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag
        assert [s for s, _ in logged["loss/train"]] == [4, 8]
        assert 0 < run.summary["test_acc"] <= 1 and run.summary["train_loss"] > 0


def test_with_log_all_ranks_every_rank_logs_a_wandb_run_of_its_own_grouped_by_the_training_run(runs, wandb_runs):
    run = runs.train([*SHORT, "strategy=ddp", "trainer.log_all_ranks=true", "logger=wandb"], env=WANDB_ENV).ok()
    by_rank = {r.config["hydra_dist"]["rank"]: r for r in wandb_runs(run.run_dir)}
    assert sorted(by_rank) == [0, 1]
    base = (run.run_dir / "wandb_run_id").read_text()
    assert [by_rank[r].run_id for r in (0, 1)] == [base, f"{base}-rank1"]
    assert {by_rank[r].run["run_group"] for r in (0, 1)} == {run.run_dir.name}
    assert [by_rank[r].run["job_type"] for r in (0, 1)] == ["rank0", "rank1"]
    rank0, rank1 = by_rank[0].history(), by_rank[1].history()
    assert set(rank1) == {tag for tag in rank0 if tag.endswith("/rank1")} and "loss/train/rank1" in rank1
    for tag, points in rank1.items():
        assert points == rank0[tag], tag  # measured on rank 1, the same numbers rank 0's run holds
    assert by_rank[0].exit_code == by_rank[1].exit_code == 0


def test_a_resumed_run_goes_on_in_the_same_wandb_run(tmp_path, runs, wandb_runs):
    """The resumed run is a run of its own: it resumes into a copy of the failed run's folder."""
    args = [*TINY, "strategy=single", "trainer.max_steps=12", "trainer.epochs=1", "trainer.checkpoint_every_n_steps=4",
            "logger=wandb"]
    failed = runs.train(args, env=WANDB_ENV, faults="raise_after_step:6:0")
    assert failed.returncode != 0
    run_dir = failed.copy_to(tmp_path / "run")
    [first] = wandb_runs(run_dir)
    assert first.exit_code == 1 and [s for s, _ in first.history()["loss/train"]] == [4]
    tag, files = uuid.uuid4().hex, tmp_path / "wandb_files"
    check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], tmp_path,
                       env={**WANDB_ENV, "WANDB_DIR": str(files), "HYDRA_DIST_TEST_TAG": tag}))
    assert gone_within(tag, 15) == [], "a W&B process outlived the run"
    [second] = wandb_runs(files)  # WANDB_DIR is where W&B writes when it is set
    assert second.run_id == first.run_id and second.run.get("resume") is True and second.exit_code == 0
    assert [s for s, _ in second.history()["loss/train"]] == [8, 12]  # resumed from the step-4 checkpoint
