"""A user's own model: built with the dataset's input shape and class count."""
from torch import nn


class MLP(nn.Module):
    def __init__(self, in_shape, num_classes, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)


class FlexibleMLP(nn.Module):
    """num_classes=None (a regression, where the dataset has no classes to count): one output."""

    def __init__(self, in_shape, num_classes=None, hidden: int = 32):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(in_shape[0], hidden), nn.ReLU(),
                                 nn.Linear(hidden, num_classes or 1))

    def forward(self, x):
        return self.net(x)
