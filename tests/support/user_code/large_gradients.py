"""Test-only: LeNet with a probe parameter whose gradient is 40,000 on every rank (a tensor hook sets it), as an fp16
gradient near the top of its range would be: two ranks' fp16 sum (80,000) overflows fp16 (65,504), their mean does
not. The probe joins the output times 0, so an inf probe makes the loss NaN
(model=lenet model._target_=large_gradients.ProbedLeNet)."""
import torch
from torch import nn

from framework.models.lenet import LeNet

GRADIENT = 40_000.0  # exact in fp16 (a multiple of its spacing, 32, above 32,768)


class ProbedLeNet(nn.Module):
    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        self.net = LeNet(in_shape, num_classes)
        self.probe = nn.Parameter(torch.zeros(1))
        self.probe.register_hook(lambda grad: torch.full_like(grad, GRADIENT))

    def forward(self, x):
        return self.net(x) + 0 * self.probe
