"""Probes scripts/gpu_first.py puts into its runs (callbacks, with this folder on PYTHONPATH, as gpu_smoke's fault
injection): what a GPU shows that a CPU cannot. Each writes <run folder>/probe_<its class>_rank<r>.json at the end
of the run.

    +callbacks.probe._target_=cuda_probes.SyncsPerStep     torch.cuda.synchronize calls per training step (PowerSGD's
                                                           hook makes one per bucket inside backward)
    +callbacks.probe._target_=cuda_probes.PeakAtSave       torch.cuda.max_memory_allocated from the end of a step
                                                           to the end of the checkpoint saved after it, in GiB
    +callbacks.probe._target_=cuda_probes.PeakOfStep2      torch.cuda.max_memory_allocated over the second training
                                                           step, in bytes (what plan.py plans: tests/runs/
                                                           test_cuda_paths.py)
"""
from __future__ import annotations

import json

import torch

from framework.callbacks.base import Callback


class _Probe(Callback):
    def __init__(self):
        self.found: dict = {}

    def on_fit_end(self, state) -> None:
        (state.run_dir / f"probe_{type(self).__name__}_rank{state.rank}.json").write_text(json.dumps(self.found))


class SyncsPerStep(_Probe):
    def on_fit_start(self, state) -> None:
        self.calls, self.steps = 0, 0
        synchronize = torch.cuda.synchronize

        def counted(*args, **kwargs):
            self.calls += 1
            return synchronize(*args, **kwargs)

        torch.cuda.synchronize = counted

    def on_train_step_end(self, state, step: int) -> None:
        self.steps += 1
        self.found = {"syncs_per_step": self.calls / self.steps}


class PeakAtSave(_Probe):
    # the stream's own synchronize: SyncsPerStep counts torch.cuda.synchronize, and these are not the run's
    def on_train_step_end(self, state, step: int) -> None:
        if state.device.type == "cuda":
            torch.cuda.current_stream(state.device).synchronize()
            torch.cuda.reset_peak_memory_stats(state.device)

    def on_checkpoint_saved(self, state, step: int, path) -> None:
        if state.device.type == "cuda":
            torch.cuda.current_stream(state.device).synchronize()
            peak = torch.cuda.max_memory_allocated(state.device) / 2**30
            self.found["peak_gib_at_save"] = max(peak, self.found.get("peak_gib_at_save", 0.0))


class PeakOfStep2(_Probe):
    """The second step's peak: the optimizer's state exists (made in step 1), as in the plan's second step."""

    def on_train_step_start(self, state, step: int) -> None:
        if step == 2 and state.device.type == "cuda":
            torch.cuda.current_stream(state.device).synchronize()
            torch.cuda.reset_peak_memory_stats(state.device)

    def on_train_step_end(self, state, step: int) -> None:
        if step == 2 and state.device.type == "cuda":
            torch.cuda.current_stream(state.device).synchronize()
            self.found["step2_peak_bytes"] = torch.cuda.max_memory_allocated(state.device)
