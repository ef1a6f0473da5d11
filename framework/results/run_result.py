"""What a run gives back: rank 0's RunResult (written to result.json, summed up by the driver and the sweep
table), or Stopped when every rank stopped on purpose together (a NaN/inf loss, a checkpoint the disk could not
take): failure is its own type, never a key inside the result."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
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
    # set by the driver
    run_dir: str = ""
    job: int = 0
    overrides: list[str] = field(default_factory=list)

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
