"""Rank 0's TensorBoard writer. Tags (per GPU = per rank or dp replica):

throughput/samples_per_sec, throughput/samples_per_sec/rank{r}, loss/train, loss/train/rank{r},
loss/val, <metric>/val (acc/val by default: the metrics group), time/step_ms, time/data_ms, lr, memory/optimizer_state_mib/rank{r} (what that rank's
optimizer state holds: ZeRO shards it), memory/max_allocated_gib/rank{r} and memory/max_reserved_gib/rank{r}
(CUDA: the peak within each logged interval, evaluation excluded),
gpu/util_percent/gpu{i} and gpu/mem_used_gib/gpu{i} (NVML's view of every GPU this node shows rank 0, when
nvidia-ml-py is installed; read at log boundaries only), and the
run's hyperparameters with its final metrics for the HParams tab; model/summary (Text tab): parameters per module. The x axis is the optimizer step.
Per GPU (framework/telemetry/per_gpu.py): time/busy_ms/rank{r} and time/wait_ms/rank{r} (per optimizer step; wait only where
the strategy measures it), time/forward_ms/rank{r} and time/backward_ms/rank{r} (dp: each replica on its GPU),
throughput/device/samples_per_busy_sec/rank{r}, throughput/device/tflops/rank{r}, throughput/device/mfu/rank{r}
(GPUs with a known peak), stragglers/busy_ratio/rank{r} and the `stragglers` text.
The Custom Scalars tab shows one chart per per-rank metric with every rank as its own line (PER_RANK_CHARTS).
"""
from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from framework.telemetry.gpu_monitor import GpuMonitor
from framework.telemetry.meters import IntervalSummary

# (chart title, regex over tags): one multiline chart each in the Custom Scalars tab, one line per rank / GPU
PER_RANK_CHARTS = {
    "time": [
        ("busy ms per step per rank", r"^time/busy_ms/rank\d+$"),
        ("wait ms per step per rank (blocked on the others)", r"^time/wait_ms/rank\d+$"),
        ("forward ms per step per dp replica (on its GPU)", r"^time/forward_ms/rank\d+$"),
        ("backward ms per step per dp replica (on its GPU)", r"^time/backward_ms/rank\d+$"),
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
    "memory": [
        ("peak allocated GiB per rank (interval)", r"^memory/max_allocated_gib/rank\d+$"),
        ("peak reserved GiB per rank (interval)", r"^memory/max_reserved_gib/rank\d+$"),
        ("optimizer state MiB per rank", r"^memory/optimizer_state_mib/rank\d+$"),
    ],
    "gpu (NVML)": [
        ("utilization % per GPU", r"^gpu/util_percent/gpu\d+$"),
        ("memory used GiB per GPU", r"^gpu/mem_used_gib/gpu\d+$"),
    ],
}


def per_rank_layout() -> dict:
    """SummaryWriter.add_custom_scalars' layout: {category: {title: ["Multiline", [regex]]}}."""
    return {category: {title: ["Multiline", [regex]] for title, regex in charts}
            for category, charts in PER_RANK_CHARTS.items()}


class TensorBoardLogger:
    def __init__(self, log_dir: Path, cuda: bool):
        self.writer = SummaryWriter(str(log_dir), flush_secs=30)
        self.cuda = cuda
        self.gpus = GpuMonitor() if cuda else None
        self.writer.add_custom_scalars(per_rank_layout())

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

    def log_per_gpu(self, step: int, s: IntervalSummary, tflops: list[float], mfu: list[float | None],
                    stragglers: list[tuple[int, float, str]]) -> None:
        w = self.writer
        for r, (busy, wait) in enumerate(zip(s.per_slot_busy_ms, s.per_slot_wait_ms)):
            w.add_scalar(f"time/busy_ms/rank{r}", busy, step)
            if wait == wait:  # NaN: this strategy cannot see its waits
                w.add_scalar(f"time/wait_ms/rank{r}", wait, step)
            forward, backward = s.per_slot_forward_ms[r], s.per_slot_backward_ms[r]
            if forward == forward:  # dp replicas only
                w.add_scalar(f"time/forward_ms/rank{r}", forward, step)
                w.add_scalar(f"time/backward_ms/rank{r}", backward, step)
            if busy > 0:
                w.add_scalar(f"throughput/device/samples_per_busy_sec/rank{r}",
                             s.per_slot_samples[r] / max(1, s.steps) / (busy / 1000), step)
        for r, rate in enumerate(tflops):
            w.add_scalar(f"throughput/device/tflops/rank{r}", rate, step)
            if mfu[r] is not None:
                w.add_scalar(f"throughput/device/mfu/rank{r}", mfu[r], step)
        for rank, ratio, line in stragglers:
            w.add_scalar(f"stragglers/busy_ratio/rank{rank}", ratio, step)
            w.add_text("stragglers", line, step)

    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, step)

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
