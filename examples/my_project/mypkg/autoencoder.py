"""Data without targets: each sample is an input only, and the step says what to learn from it (here: to
reconstruct it). The framework gives a step of the user's own the batch as it is."""
import torch
from torch import nn
from torch.utils.data import Dataset

from framework.training.step import StepOutput


class Codes(Dataset):
    """x [dim]: points near a 4-dimensional subspace (a fixed random projection of 4 numbers), so a 4-wide code can
    reconstruct them; the same subspace for train and test."""

    def __init__(self, train: bool = True, size: int = 512, dim: int = 16):
        g = torch.Generator().manual_seed(0 if train else 1)
        basis = torch.randn(4, dim, generator=torch.Generator().manual_seed(42))
        self.x = torch.randn(size, 4, generator=g) @ basis + 0.05 * torch.randn(size, dim, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]  # no target


class AutoEncoder(nn.Module):
    def __init__(self, in_shape, code: int = 4, hidden: int = 32):
        super().__init__()
        dim = in_shape[0]
        self.encode = nn.Sequential(nn.Linear(dim, hidden), nn.Tanh(), nn.Linear(hidden, code))
        self.decode = nn.Sequential(nn.Linear(code, hidden), nn.Tanh(), nn.Linear(hidden, dim))

    def forward(self, x):
        return self.decode(self.encode(x))


class Reconstruct:
    """The step: the batch is the inputs; the loss compares the model's reconstruction with them, and the metrics
    score the reconstruction against the inputs too."""

    def __call__(self, model, batch, loss) -> StepOutput:
        reconstruction = model(batch).float()
        return StepOutput(loss(reconstruction, batch), reconstruction, batch, len(batch))
