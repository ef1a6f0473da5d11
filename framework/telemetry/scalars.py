"""The scalars of a log interval by their tag names (docs/telemetry.md lists them), for every logger alike:
TensorBoard, MLflow and CSV log the same names. The frame's are named here; every registered meter names its own
(framework/telemetry/meter.py), and they come with the interval's."""
from __future__ import annotations

from framework.telemetry.meters import IntervalSummary


def lr_scalars(lr: float | dict[str, float]) -> dict[str, float]:
    """`lr` (the first param group's) and, with several groups (optimizer.param_groups), `lr/<group>` for each."""
    if not isinstance(lr, dict):
        return {"lr": lr}
    first = next(iter(lr.values()), float("nan"))
    return {"lr": first, **({f"lr/{name}": value for name, value in lr.items()} if len(lr) > 1 else {})}


def interval_scalars(s: IntervalSummary, lr: float | dict[str, float]) -> dict[str, float]:
    """lr: one number, or every param group's by name (Trainer.lrs()). An interval whose steps were all skipped
    (trainer.on_nonfinite=skip) has no loss and no throughput point: train/skipped_steps says what happened."""
    scalars = {"time/step_ms": s.step_ms, **lr_scalars(lr)}
    if s.trained:
        scalars.update({"throughput/samples_per_sec": s.samples_per_sec, "loss/train": s.loss})
    if s.skipped_steps:
        scalars["train/skipped_steps"] = s.skipped_steps
    for r, (rate, loss) in enumerate(zip(s.per_slot_samples_per_sec, s.per_slot_loss) if s.trained else ()):
        scalars[f"throughput/samples_per_sec/rank{r}"] = rate
        scalars[f"loss/train/rank{r}"] = loss
    return {**scalars, **s.tags}  # the registered meters' (framework/telemetry/meter_registry.py)


def per_gpu_scalars(s: IntervalSummary, tflops: list[float], mfu: list[float | None],
                    stragglers: list[tuple[int, float, str]]) -> dict[str, float]:
    scalars = {}
    for r, busy in enumerate(s.per_slot_busy_ms):  # the step less the waits the wait meter counted
        scalars[f"time/busy_ms/rank{r}"] = busy
        if busy > 0 and s.trained:
            scalars[f"throughput/device/samples_per_busy_sec/rank{r}"] = s.per_slot_samples[r] / max(1, s.steps) / (
                busy / 1000)
    for r, rate in enumerate(tflops if s.trained else []):
        scalars[f"throughput/device/tflops/rank{r}"] = rate
        if mfu[r] is not None:
            scalars[f"throughput/device/mfu/rank{r}"] = mfu[r]
    for rank, ratio, _ in stragglers:
        scalars[f"stragglers/busy_ratio/rank{rank}"] = ratio
    return scalars


def eval_scalars(loss: float, metrics: dict[str, float]) -> dict[str, float]:
    return {"loss/val": loss, **{f"{name}/val": value for name, value in metrics.items()}}


def report_scalars(report, lr: float | dict[str, float]) -> dict[str, float]:
    """Everything a log boundary's IntervalReport (framework/telemetry/per_gpu.py) holds, for a logger that writes
    plain values (CSV, MLflow)."""
    return {**interval_scalars(report.summary, lr),
            **per_gpu_scalars(report.summary, report.tflops, report.mfu,
                              [(g.rank, g.ratio, "") for g in report.stragglers]),
            **report.logged}
