"""trainer.profile=[first,last]: torch.profiler records steps first..last on every rank (CPU, and CUDA activity on
GPUs) into <run folder>/profile/rank<r>.trace.json (Chrome trace format: open it in https://ui.perfetto.dev or
chrome://tracing), and each rank's time over those steps is split into computation, communication and idle
(framework/telemetry/trace_breakdown.py): printed by rank 0 and logged to TensorBoard as profile/*_ms/rank<r>.
Built by the worker when trainer.profile is set; it works through the callback hooks only."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from framework.callbacks.base import Callback
from framework.telemetry.trace_breakdown import Breakdown, breakdown_of

PROFILE_DIR = "profile"


class StepProfiler(Callback):
    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self.profiler: profile | None = None
        self._step = None  # the open `train step N` range

    def on_fit_start(self, state) -> None:
        if state.is_main and state.total_steps and self.first > state.total_steps:
            state.say(f"warning: trainer.profile=[{self.first}, {self.last}] starts after this run's last step "
                      f"({state.total_steps}): nothing is profiled")

    def on_train_step_start(self, state, step: int) -> None:
        if step == self.first and self.profiler is None:
            activities = [ProfilerActivity.CPU]
            if state.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self.profiler = profile(activities=activities)
            self.profiler.start()
        if self.profiler is not None:
            self._step = torch.profiler.record_function(f"train step {step}")
            self._step.__enter__()

    def on_train_step_end(self, state, step: int) -> None:
        if self.profiler is None:
            return
        self._step.__exit__(None, None, None)
        if step == self.last:
            self._finish(state, step)

    def on_fit_end(self, state) -> None:  # the run ended before the last profiled step
        if self.profiler is not None:
            self._finish(state, state.step)

    def _finish(self, state, step: int) -> None:
        profiler, self.profiler = self.profiler, None
        if state.device.type == "cuda":
            torch.cuda.synchronize(state.device)  # the last step's kernels into the trace
        profiler.stop()
        folder = state.run_dir / PROFILE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{state.rank}.trace.json"
        profiler.export_chrome_trace(str(path))
        mine = breakdown_of(path)
        every = state.gather_objects(mine)
        if state.is_main:
            self._report(state, step, every, folder)

    def _report(self, state, step: int, every: list[Breakdown], folder) -> None:
        state.say(f"profile of steps {self.first}-{step} (traces: {folder}/rank<r>.trace.json), ms per step:")
        for rank, b in enumerate(every):
            state.say(f"  rank {rank}: {b.describe()}")
        # slow to import (about 0.1 s): only a run that profiles pays for it here
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(str(state.run_dir), filename_suffix=".profile") as writer:
            for rank, b in enumerate(every):
                for name, value in b.per_step_ms().items():
                    writer.add_scalar(f"profile/{name}_ms/rank{rank}", value, step)
            writer.add_text("profile", _table(self.first, step, every), step)


def _table(first: int, last: int, every: list[Breakdown]) -> str:
    """The breakdown as a Markdown table for TensorBoard's Text tab."""
    rows = [f"steps {first}-{last}, ms per step ({every[0].timeline} timeline)", "",
            "| rank | step | computation | communication | idle |", "| --- | --- | --- | --- | --- |"]
    for rank, b in enumerate(every):
        ms = b.per_step_ms()
        rows.append(f"| {rank} | {ms['step']:.1f} | " + " | ".join(
            f"{ms[k]:.1f} ({100 * ms[k] / ms['step'] if ms['step'] else 0:.0f}%)"
            for k in ("computation", "communication", "idle")) + " |")
    return "\n".join(rows)
