"""Rank 0's TensorBoard writer. Tags (per GPU = per rank or dp replica):

throughput/samples_per_sec, throughput/samples_per_sec/rank{r}, loss/train, loss/train/rank{r},
loss/val, <metric>/val (acc/val by default: the metrics group), time/step_ms, time/data_ms, lr, memory/optimizer_state_mib/rank{r} (what that rank's
optimizer state holds: ZeRO shards it), memory/max_allocated_gib/rank{r} and memory/max_reserved_gib/rank{r}
(CUDA: the peak within each logged interval, evaluation excluded),
gpu/util_percent/gpu{i} and gpu/mem_used_gib/gpu{i} (NVML's view of every GPU this node shows rank 0, when
nvidia-ml-py is installed; read at log boundaries only), and the
run's hyperparameters with its final metrics for the HParams tab. The x axis is the optimizer step.
"""
from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from framework.gpu_monitor import GpuMonitor
from framework.meters import IntervalSummary


class TensorBoardLogger:
    def __init__(self, log_dir: Path, cuda: bool):
        self.writer = SummaryWriter(str(log_dir), flush_secs=30)
        self.cuda = cuda
        self.gpus = GpuMonitor() if cuda else None

    def log_interval(self, step: int, s: IntervalSummary, lr: float) -> None:
        w = self.writer
        w.add_scalar("throughput/samples_per_sec", s.samples_per_sec, step)
        w.add_scalar("loss/train", s.loss, step)
        w.add_scalar("time/step_ms", s.step_ms, step)
        w.add_scalar("time/data_ms", s.data_ms, step)
        w.add_scalar("lr", lr, step)
        for r, (rate, loss) in enumerate(zip(s.per_slot_samples_per_sec, s.per_slot_loss)):
            w.add_scalar(f"throughput/samples_per_sec/rank{r}", rate, step)
            w.add_scalar(f"loss/train/rank{r}", loss, step)
            w.add_scalar(f"memory/optimizer_state_mib/rank{r}", s.per_slot_optimizer_state_mib[r], step)
            if self.cuda:
                w.add_scalar(f"memory/max_allocated_gib/rank{r}", s.per_slot_max_mem_gib[r], step)
                w.add_scalar(f"memory/max_reserved_gib/rank{r}", s.per_slot_max_reserved_gib[r], step)
        for gpu in self.gpus.read() if self.gpus else []:
            w.add_scalar(f"gpu/util_percent/gpu{gpu.index}", gpu.util_percent, step)
            w.add_scalar(f"gpu/mem_used_gib/gpu{gpu.index}", gpu.mem_used_gib, step)

    def log_eval(self, step: int, loss: float, metrics: dict[str, float]) -> None:
        self.writer.add_scalar("loss/val", loss, step)
        for name, value in metrics.items():
            self.writer.add_scalar(f"{name}/val", value, step)

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
