"""Test-only: a model that is an nn.Sequential, as pipeline tutorials build the models they cut, from a function a
config names by _target_ (model=lenet model._target_=sequential_models.mlp)."""
import math

from torch import nn


def mlp(in_shape, num_classes: int, hidden: int = 64) -> nn.Sequential:
    """Images flattened, three hidden layers; a ReLU(inplace=True) where the even split starts the second stage."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(in_shape), hidden), nn.Tanh(), nn.Linear(hidden, hidden),
        nn.ReLU(inplace=True), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, num_classes))
