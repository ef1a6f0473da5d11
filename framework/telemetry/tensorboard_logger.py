"""Rank 0's TensorBoard writer, the x axis the optimizer step: the interval's scalars by their tag names
(framework/telemetry/scalars.py names the frame's and the per-GPU ones; each registered meter names its own in its
file, framework/telemetry/meter_registry.py; docs/telemetry.md has the whole table), gpu/util_percent/gpu{i} and
gpu/mem_used_gib/gpu{i} (NVML's view of every GPU this node shows rank 0, when nvidia-ml-py is installed; read at log
boundaries only), the `stragglers` text, the run's hyperparameters with its final metrics for the HParams tab, and
model/summary (Text tab): parameters per module. The Custom Scalars tab shows one chart per per-rank metric with every
rank as its own line (PER_RANK_CHARTS and the meters' `charts`).
"""
from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from framework.telemetry.gpu_monitor import GpuMonitor
from framework.telemetry.meter_registry import METERS
from framework.telemetry.meters import IntervalSummary
from framework.telemetry.scalars import eval_scalars, interval_scalars, per_gpu_scalars

# (chart title, regex over tags): one multiline chart each in the Custom Scalars tab, one line per rank / GPU; the
# meters add theirs (per_rank_layout)
PER_RANK_CHARTS = {
    "time": [
        ("busy ms per step per rank", r"^time/busy_ms/rank\d+$"),
        ("straggler busy ratio (rank's busy time / median)", r"^stragglers/busy_ratio/rank\d+$"),
    ],
    "throughput": [
        ("samples/s per rank", r"^throughput/samples_per_sec/rank\d+$"),
        ("samples per busy second per rank (what the device does alone)",
         r"^throughput/device/samples_per_busy_sec/rank\d+$"),
        ("TFLOP/s per rank", r"^throughput/device/tflops/rank\d+$"),
        ("MFU per rank", r"^throughput/device/mfu/rank\d+$"),
    ],
    "loss": [("training loss per rank", r"^loss/train/rank\d+$")],
    "lr": [("lr per parameter group", r"^lr/.+$")],
    "gpu (NVML)": [
        ("utilization % per GPU", r"^gpu/util_percent/gpu\d+$"),
        ("memory used GiB per GPU", r"^gpu/mem_used_gib/gpu\d+$"),
    ],
}


def per_rank_layout() -> dict:
    """SummaryWriter.add_custom_scalars' layout: {category: {title: ["Multiline", [regex]]}}, the frame's charts and
    every registered meter's (its `charts`)."""
    layout = {category: {title: ["Multiline", [regex]] for title, regex in charts}
              for category, charts in PER_RANK_CHARTS.items()}
    for meter in METERS:
        for category, charts in getattr(meter, "charts", {}).items():
            layout.setdefault(category, {}).update({title: ["Multiline", [regex]] for title, regex in charts})
    return layout


class TensorBoardLogger:
    def __init__(self, log_dir: Path, cuda: bool):
        self.writer = SummaryWriter(str(log_dir), flush_secs=30)
        self.cuda = cuda
        self.gpus = GpuMonitor() if cuda else None
        self.writer.add_custom_scalars(per_rank_layout())

    def log_interval(self, step: int, s: IntervalSummary, lr: float | dict[str, float]) -> None:
        self._add(interval_scalars(s, lr), step)
        for gpu in self.gpus.read() if self.gpus else []:
            self.writer.add_scalar(f"gpu/util_percent/gpu{gpu.index}", gpu.util_percent, step)
            self.writer.add_scalar(f"gpu/mem_used_gib/gpu{gpu.index}", gpu.mem_used_gib, step)

    def log_per_gpu(self, step: int, s: IntervalSummary, tflops: list[float], mfu: list[float | None],
                    stragglers: list[tuple[int, float, str]]) -> None:
        self._add(per_gpu_scalars(s, tflops, mfu, stragglers), step)
        for _, _, line in stragglers:
            self.writer.add_text("stragglers", line, step)

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        self._add(scalars, step)

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, step)

    def log_eval(self, step: int, loss: float, metrics: dict[str, float]) -> None:
        self._add(eval_scalars(loss, metrics), step)

    def _add(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def log_hparams(self, params: dict, metrics: dict) -> None:
        """Written into this run's own event file (SummaryWriter.add_hparams would make a sub-run)."""
        for summary in hparams(params, metrics):
            self.writer.file_writer.add_summary(summary)
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
