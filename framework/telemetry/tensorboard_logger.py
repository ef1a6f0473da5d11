"""Rank 0's TensorBoard writer. Tags (per GPU = per rank or dp replica):

throughput/samples_per_sec, throughput/samples_per_sec/rank{r} (and throughput/tokens_per_sec[/rank{r}] where the
step counts tokens), loss/train, loss/train/rank{r} (none of these for an interval whose steps were all skipped),
train/skipped_steps (trainer.on_nonfinite=skip: the interval's skipped steps, where there were some),
loss/val, <metric>/val (acc/val by default: the metrics group), time/step_ms, time/data_ms, lr (and lr/<group> for each
param group when optimizer.param_groups makes several), memory/optimizer_state_mib/rank{r} (what that rank's
optimizer state holds: ZeRO shards it), memory/max_allocated_gib/rank{r} and memory/max_reserved_gib/rank{r}
(CUDA: the peak within each logged interval, evaluation excluded),
gpu/util_percent/gpu{i} and gpu/mem_used_gib/gpu{i} (NVML's view of every GPU this node shows rank 0, when
nvidia-ml-py is installed; read at log boundaries only), and the
run's hyperparameters with its final metrics for the HParams tab; model/summary (Text tab): parameters per module. The x axis is the optimizer step.
Per GPU (framework/telemetry/per_gpu.py): time/busy_ms/rank{r} and time/wait_ms/rank{r} (per optimizer step; wait only where
the strategy measures it; pipeline parallel: the stage's bubble), time/comm_ms/rank{r} (pipeline parallel: the
stage's communication), time/forward_ms/rank{r} and time/backward_ms/rank{r} (dp: each replica on its GPU; pipeline
parallel: each stage's compute),
throughput/device/samples_per_busy_sec/rank{r}, throughput/device/tflops/rank{r}, throughput/device/mfu/rank{r}
(GPUs with a known peak), stragglers/busy_ratio/rank{r} and the `stragglers` text; comm/bytes_sent/rank{r} (gradient
bytes that rank handed to its collectives per optimizer step: ddp, fsdp, horovod) and comm/compression_ratio (what the
gradients weigh uncompressed over what was sent, all ranks: strategy.compression).
The Custom Scalars tab shows one chart per per-rank metric with every rank as its own line (PER_RANK_CHARTS).
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
