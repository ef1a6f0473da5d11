"""A user's own stream: any torch IterableDataset works (docs/data-and-models.md). This one makes Gaussian blobs on
the fly (a stand-in for records read from files or a socket), reshuffles per epoch (set_epoch), and keeps
torchdata's Stateful protocol (state_dict / load_state_dict), so a run killed mid-epoch resumes it from its own state
instead of reading the samples it had given again. The framework deals it over ranks and DataLoader workers."""
import torch
from torch.utils.data import IterableDataset


class BlobStream(IterableDataset):
    def __init__(self, train: bool = True, size: int = 2048, classes: int = 3, dim: int = 8):
        self.size, self.classes, self.dim = size, classes, dim
        self.seed = 0 if train else 1
        self.centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(42)) * 3
        self.in_shape, self.num_classes = (dim,), classes  # said, so nothing is counted from the stream
        self.epoch, self.next, self.resume_at = 0, 0, None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "next": self.next}

    def load_state_dict(self, state: dict) -> None:
        self.resume_at = state["next"] if state["epoch"] == self.epoch else None

    def __iter__(self):
        start, self.resume_at = self.resume_at or 0, None
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        labels = torch.randint(0, self.classes, (self.size,), generator=g)
        noise = torch.randn(self.size, self.dim, generator=g)
        for i in range(start, self.size):
            self.next = i + 1
            yield self.centers[labels[i]] + noise[i], int(labels[i])
