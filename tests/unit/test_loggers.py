"""The logger group: TensorBoard (default), CSV and MLflow, alone or together. Real runs; the CSV is compared with
TensorBoard's own reader, the MLflow store is read back with MLflow's own client (a sweep: a parent run and its
jobs as children, with params, per-step metrics, per-rank throughput and artifacts)."""
import pytest

from framework.common.errors import ConfigError
from support.processes import TINY

SHORT = [*TINY, "trainer.max_steps=8", "trainer.epochs=1"]
RUN = [*SHORT, "strategy=single"]


def test_without_the_extra_logger_mlflow_is_one_line(monkeypatch):
    from framework.callbacks import mlflow_log
    from framework.results import mlflow_tracking

    monkeypatch.setattr(mlflow_tracking.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^logger=mlflow needs MLflow, an optional extra: "
                                          r"pip install 'hydra-dist\[mlflow\]'$"):
        mlflow_log.MLflowLog()
