"""trainer.check_fit: before a run starts on GPUs, the driver plans it (framework/plan/rows.py, on as many ranks as
it is about to start) and refuses it in one line when the planned peak (rank 0's; a pipeline's largest rank's)
beside the GPU's device constants (framework/plan/device_constants.py) exceeds the GPU's memory. A run the plan
cannot plan yet is said in one line and starts unchecked. Runs on the CPU plan nothing (the driver does not call
this)."""
from __future__ import annotations

from typing import Callable

from omegaconf import DictConfig

from framework.common.errors import ConfigError, first_line
from framework.plan.gpus import Gpu
from framework.plan.rows import plan_row

MIB = 2 ** 20


def check_fit(cfg: DictConfig, workers: int, gpu: Gpu, say: Callable[[str], None]) -> None:
    """ConfigError, one line, when the run of `cfg` on `workers` ranks does not fit `gpu`; `say` tells why a run
    that cannot be planned is not checked."""
    try:
        row = plan_row(cfg, workers)
    except ConfigError as why:
        say(f"trainer.check_fit: not checked: {why}")
        return
    except Exception as exc:  # a plan that fails is no reason to stop a run the driver accepted: said, not hidden
        say(f"trainer.check_fit: not checked: planning failed ({type(exc).__name__}: {first_line(exc)}); "
            "trainer.check_fit=false skips the plan")
        return
    if gpu.fits(row.peak, workers):
        return
    room = gpu.room(workers)
    raise ConfigError(
        f"trainer.check_fit: this run does not fit {gpu.name}: rank {row.rank}'s planned peak is {row.peak / MIB:.0f} "
        f"MiB of tensors, and {room / MIB:.0f} MiB of its {gpu.memory / MIB:.0f} MiB are left beside the device "
        "constants (estimates, docs/plan.md); plan it with `python plan.py` and your overrides, or "
        "trainer.check_fit=false to start it anyway")
