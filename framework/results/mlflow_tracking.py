"""What the MLflow logger (logger=mlflow) shares between a run and its sweep: the tracking store (a local SQLite file
by default, or a server's URI), the experiment (its artifacts under the outputs folder, not in the working
directory), and the sweep's parent run, whose id sits in the sweep folder for its jobs to find (any launcher: the
jobs only need the sweep folder). MLflow is an optional extra."""
from __future__ import annotations

from pathlib import Path

from framework.common.errors import ConfigError
from framework.config.extras import missing_line, require_extra

PARENT_RUN_FILE = "mlflow_parent_run_id"
DEFAULT_STORE = Path("outputs") / "mlflow.db"
ARTIFACTS = Path("outputs") / "mlflow-artifacts"
MISSING = missing_line("mlflow", "logger=mlflow")


def require_mlflow() -> None:
    require_extra("mlflow", "logger=mlflow")


def mlflow_api():
    """MLflow's client and the entities log_batch takes."""
    # an optional extra, and 2-4 s of imports: only rank 0 of a logger=mlflow run imports it
    try:
        from mlflow.entities import Metric, Param  # optional extra
        from mlflow.tracking import MlflowClient  # optional extra
    except ImportError:
        raise ConfigError(MISSING) from None
    return MlflowClient, Metric, Param


def store_uri(tracking_uri: str | None) -> str:
    """tracking_uri as given, or sqlite:///<absolute path of outputs/mlflow.db> (its folder made)."""
    if tracking_uri:
        return tracking_uri
    path = DEFAULT_STORE.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def client_for(tracking_uri: str | None):
    client_class, _, _ = mlflow_api()
    try:
        return client_class(tracking_uri=store_uri(tracking_uri))
    except Exception as exc:  # MlflowException: a store it will not open (its file store since 3.x, a bad scheme)
        reason = " ".join(str(exc).split()).split(". ")[0]
        raise ConfigError(f"callbacks.mlflow.tracking_uri={tracking_uri} is not allowed: MLflow cannot open it "
                          f"({reason}); give sqlite:///<path>.db, a server's http(s):// URI or null") from None


def experiment_id(client, name: str) -> str:
    """The experiment's id, made on first use; a race with another job making it ends with one experiment."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=ARTIFACTS.resolve().as_uri())
    except Exception:  # MlflowException: another job created it first
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def parent_run_of(run_dir: Path) -> str | None:
    """The sweep's parent run, when run_dir is a job of a sweep that logs to MLflow."""
    marker = run_dir.parent / PARENT_RUN_FILE
    return marker.read_text().strip() if marker.is_file() else None


def flat_params(tree, prefix: str = "") -> dict[str, str]:
    """A config as MLflow params: dotted keys, values as text (MLflow's limit: 6000 characters each)."""
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(flat_params(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(tree)[:6000]}
