"""The logger group: TensorBoard (default), CSV and MLflow, alone or together. Real runs; the CSV is compared with
TensorBoard's own reader, the MLflow store is read back with MLflow's own client (a sweep: a parent run and its
jobs as children, with params, per-step metrics, per-rank throughput and artifacts)."""
import csv

import pytest

from support.processes import TINY, check_ok, run_train
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
