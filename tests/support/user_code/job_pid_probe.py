"""A Hydra callback for tests: each job writes the pid of the process that ran it to <job folder>/job.pid
(`+hydra.callbacks.job_pid._target_=job_pid_probe.JobPid`, with tests/ on PYTHONPATH for joblib's workers)."""
import os
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback


class JobPid(Callback):
    def on_job_end(self, config, job_return, **kwargs) -> None:
        (Path(HydraConfig.get().runtime.output_dir) / "job.pid").write_text(str(os.getpid()))
