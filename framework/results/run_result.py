"""What a run gives back: rank 0's RunResult (written to result.json, summed up by the driver and the sweep
table), or Stopped when every rank stopped on purpose together (a NaN/inf loss, a checkpoint the disk could not
take): failure is its own type, never a key inside the result."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(kw_only=True)
class RunResult:
    test_metrics: dict[str, float]  # the metrics group's names -> their value on the test split
    objective: str  # trainer.objective: what a sweep optimizes (a metric's name, or loss)
    test_loss: float
    train_loss: float
    samples_per_sec: float
    per_rank_samples_per_sec: list[float]
    per_rank_max_memory_gib: list[float]
    train_seconds: float
    steps: int
    skipped_steps: int
    epochs: int
    processes: int
    global_batch: int
    micro_batch: int
    strategy: str
    device: str
    resumed_from_step: int
    checkpoint: str
    objective_higher_is_better: bool = True  # how a sweep's summary picks its best config
    # what gradients travelled as (strategy.compression: "none", "fp16", "powersgd rank 2"), and what that did, where
    # the engine counts its gradient bytes (ddp, fsdp, horovod): what the gradients weigh over what was sent, bytes
    # per rank and step (both over the compressed steps, or the run's without compression), and the wait per step
    # (mean over ranks) in the steps without and with compression (a powersgd run's warm-up is without)
    compression: str = "none"
    compression_ratio: float = math.nan
    gradient_bytes_per_step: float = math.nan
    wait_ms_uncompressed: float = math.nan
    wait_ms_compressed: float = math.nan
    # set by the driver
    run_dir: str = ""
    job: int = 0
    overrides: list[str] = field(default_factory=list)

    def compression_line(self) -> str:
        """What compression did, for the run's last line ('' without compression):
        "powersgd rank 2: 37x fewer gradient bytes; wait 12.1 -> 3.4 ms per step"."""
        if self.compression == "none" or self.compression_ratio != self.compression_ratio:
            return ""
        if self.wait_ms_compressed != self.wait_ms_compressed and self.compression_ratio <= 1:
            return f"{self.compression}: no step sent compressed"
        ratio = self.compression_ratio
        line = f"{self.compression}: {ratio:.0f}x" if ratio >= 10 else f"{self.compression}: {ratio:.1f}x"
        line += " fewer gradient bytes"
        before, after = self.wait_ms_uncompressed, self.wait_ms_compressed
        if after == after:
            line += f"; wait {before:.1f} -> {after:.1f} ms per step" if before == before else \
                f"; wait {after:.1f} ms per step"
        return line

    @property
    def objective_value(self) -> float:
        return self.test_loss if self.objective == "loss" else self.test_metrics[self.objective]

    def to_json(self) -> dict:
        """result.json's fields: test_<metric> for each metric beside the rest, as the sweep table reads them."""
        fields = asdict(self)
        metrics = fields.pop("test_metrics")
        return {**{f"test_{name}": value for name, value in metrics.items()}, "metrics": list(metrics), **fields}


@dataclass
class Stopped:
    """Every rank stopped together on purpose; the reason says why and what is kept."""

    reason: str
