"""The logger group in this process: logger=mlflow without the extra is one line. The loggers' real stores:
tests/runs/test_loggers.py."""
import pytest

from framework.common.errors import ConfigError


def test_without_the_extra_logger_mlflow_is_one_line(monkeypatch):
    from framework.callbacks import mlflow_log
    from framework.results import mlflow_tracking

    monkeypatch.setattr(mlflow_tracking.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"^logger=mlflow needs MLflow, an optional extra: "
                                          r"pip install 'hydra-dist\[mlflow\]'$"):
        mlflow_log.MLflowLog()
