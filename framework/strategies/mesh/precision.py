"""The mesh engine's precision: bf16 through FSDP2's MixedPrecisionPolicy where FSDP2 runs (data-parallel axes), else
torch.autocast (tensor or pipeline parallel alone: nothing casts the parameters); and the optimizer step's gradient
norm over the whole model: each group of gradients of one DTensor layout measured by DTensor (a tensor-parallel or
sharded gradient counts each element once over its mesh), plain ones (replicated on every TP rank) once, then summed
over the pipeline stages, every stage's parameters once (a tied copy by its first holder)."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

from framework.strategies.mesh.tied import TiedGradients
from framework.training.precision import Precision


class MeshPrecision(Precision):
    def __init__(self, name: str, device: torch.device, params: list[torch.nn.Parameter], fsdp: bool,
                 tied: TiedGradients, pp_group=None):
        super().__init__(name, device)
        self.device = device
        self.params, self.fsdp, self.tied, self.pp_group = params, fsdp, tied, pp_group

    def autocast(self):
        return contextlib.nullcontext() if self.fsdp else super().autocast()

    def optimizer_step(self, model, optimizer, max_norm, skip_nonfinite: bool) -> bool:
        self._reduce_partial_gradients()
        self.tied.sync()
        return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)

    def _reduce_partial_gradients(self) -> None:
        """A parameter replicated over the tp ranks that runs on a share of the sequence (a sequence-parallel norm)
        gets a Partial gradient, each rank its share's sum: reduced here to the parameter's own layout, so the step,
        the clipping norm and the optimizer state (which checkpoints cannot hold as Partial) see the whole of it."""
        for p in self.params:
            g = p.grad
            if isinstance(g, DTensor) and any(placement.is_partial() for placement in g.placements):
                p.grad = g.redistribute(g.device_mesh, p.placements)

    def clip_grad_norm(self, model, optimizer, max_norm: float | None) -> torch.Tensor:
        groups = self._grad_groups()
        norm = self._total_norm(groups)
        if max_norm:
            for grads in groups.values():
                clip_grads_with_norm_(grads, max_norm, norm)
        return norm

    def _grad_groups(self) -> dict:
        """Parameters with a gradient, by their gradient's DTensor layout (None: plain tensors)."""
        groups: dict = {}
        for p in self.params:
            if p.grad is not None:
                g = p.grad
                key = (g.device_mesh, g.placements) if isinstance(g, DTensor) else None
                groups.setdefault(key, []).append(p)
        return groups

    def _total_norm(self, groups: dict) -> torch.Tensor:
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for params in groups.values():
            counted = [p.grad for p in params if id(p) not in self.tied.not_counted]
            if counted:
                norm = get_total_norm(counted)
                norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
                squares = squares + norm.float().to(self.device) ** 2
        if self.pp_group is not None:
            dist.all_reduce(squares, group=self.pp_group)
        return squares.sqrt()
