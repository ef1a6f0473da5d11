"""What a user brings that makes a run on several workers differ from one process, for verify.py's tests
(tests/runs/test_verify.py): a CNN with BatchNorm, a net with dropout, and a step that scales its loss by the world
size (a mistake seen in users' code: DDP already averages the gradients)."""
import torch.distributed as dist
from torch import nn

from framework.training.step import Supervised


class BatchNormCNN(nn.Module):
    """conv 16@3x3, BatchNorm, ReLU, maxpool, then a linear layer: the smallest CNN with BatchNorm."""

    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        channels, height, width = in_shape
        self.features = nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                                      nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(16 * (height // 2) * (width // 2), num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))


class DropoutNet(nn.Module):
    """An MLP with dropout between its layers."""

    def __init__(self, in_shape, num_classes: int, dropout: float = 0.5):
        super().__init__()
        features = 1
        for size in in_shape:
            features *= size
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(features, 64), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x)


class WorldSizeScaledStep(Supervised):
    """The default step, its loss multiplied by the number of processes."""

    def __call__(self, model, batch, loss):
        out = super().__call__(model, batch, loss)
        out.loss = out.loss * (dist.get_world_size() if dist.is_initialized() else 1)
        return out
