"""Test-only: a newcomer's dataset, in the shape of the DDP tutorial series' datautils.py `MyTrainDataset`
(pytorch/examples, distributed/ddp-tutorial-series: `size` random (input [20], target [1]) pairs, trained there with
a torch.nn.Linear(20, 1)), copied as a user would copy it, unchanged."""
import torch
from torch.utils.data import Dataset


class MyTrainDataset(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]
