"""The toy model of the DataParallel tutorial (nn.Linear(5, 2) on random data), sized from the dataset."""
import math

from torch import nn


class LinearModel(nn.Module):
    def __init__(self, in_shape, num_classes: int, print_sizes: bool = False):
        super().__init__()
        self.fc = nn.Linear(math.prod(in_shape), num_classes)
        self.print_sizes = print_sizes

    def forward(self, x):
        out = self.fc(x.flatten(1))
        if self.print_sizes:  # as the tutorial does: each replica reports the slice it got
            print(f"\tIn Model: input size {tuple(x.size())} output size {tuple(out.size())}", flush=True)
        return out
