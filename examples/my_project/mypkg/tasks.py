"""Five experiments that are not single-label image classification, each a Dataset and a model of the user's own
(the losses and metrics are torch's and torchmetrics', named in conf/experiment/*.yaml). Every dataset is generated
from a fixed seed, learnable, and small enough to train in seconds on a CPU."""
import torch
from torch import nn
from torch.utils.data import Dataset


def _generator(train: bool) -> torch.Generator:
    return torch.Generator().manual_seed(0 if train else 1)


class Waves(Dataset):
    """Regression: x [8] -> y [1] = a fixed smooth function of x plus a little noise (float targets)."""

    def __init__(self, train: bool = True, size: int = 512):
        g = _generator(train)
        self.x = torch.randn(size, 8, generator=g)
        w = torch.linspace(-1, 1, 8)
        self.y = (torch.sin(self.x @ w) + 0.05 * torch.randn(size, generator=g)).unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Regressor(nn.Module):
    def __init__(self, in_shape, outputs: int = 1, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_shape[0], hidden), nn.Tanh(), nn.Linear(hidden, outputs))

    def forward(self, x):
        return self.net(x)


class CountingText(Dataset):
    """A character-level language model's data: x and y are token sequences [T] (y is x shifted by one) cut from a
    text that repeats a few words in a fixed order, so the next character is learnable."""

    def __init__(self, train: bool = True, block: int = 16, size: int = 256):
        words = "one two three four five six seven eight nine ten ".split(" ")
        g = _generator(train)
        text = " ".join(words[i % 10] for i in range(4000))
        self.vocab = sorted(set(text))
        ids = torch.tensor([self.vocab.index(c) for c in text])
        starts = torch.randint(0, len(ids) - block - 1, (size,), generator=g)
        self.x = torch.stack([ids[s:s + block] for s in starts])
        self.y = torch.stack([ids[s + 1:s + block + 1] for s in starts])
        self.num_classes = len(self.vocab)  # what the model's vocabulary is sized from

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class TinyLM(nn.Module):
    """Embedding, a GRU, a head: logits [B, T, V] for token ids [B, T]."""

    def __init__(self, num_classes, hidden: int = 64):
        super().__init__()
        self.embed = nn.Embedding(num_classes, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, ids):
        return self.head(self.rnn(self.embed(ids))[0])


class Blocks(Dataset):
    """Segmentation: 1 x 16 x 16 images with a bright and a dim square on noise; the mask [16, 16] says, per
    pixel, 0 background, 1 bright square, 2 dim square."""

    def __init__(self, train: bool = True, size: int = 256):
        g = _generator(train)
        self.x = 0.1 * torch.randn(size, 1, 16, 16, generator=g)
        self.y = torch.zeros(size, 16, 16, dtype=torch.long)
        for i in range(size):
            for label, level in ((1, 1.0), (2, 0.5)):
                r, c = torch.randint(0, 12, (2,), generator=g).tolist()
                self.x[i, 0, r:r + 4, c:c + 4] += level
                self.y[i, r:r + 4, c:c + 4] = label

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Segmenter(nn.Module):
    def __init__(self, in_shape, num_classes, width: int = 16):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(in_shape[0], width, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, num_classes, 1))

    def forward(self, x):
        return self.net(x)


class ImageAndFeatures(Dataset):
    """Two inputs per sample, a dict {"image": [1, 8, 8], "features": [4]}; the class (0, 1 or 2) needs both."""

    def __init__(self, train: bool = True, size: int = 384):
        g = _generator(train)
        self.y = torch.randint(0, 3, (size,), generator=g)
        self.image = torch.randn(size, 1, 8, 8, generator=g) * 0.3
        self.image[:, 0, :4, :4] += (self.y == 1).float().view(-1, 1, 1)
        self.features = torch.randn(size, 4, generator=g) * 0.3
        self.features[:, 0] += (self.y == 2).float()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"image": self.image[i], "features": self.features[i]}, self.y[i]


class TwoInputNet(nn.Module):
    def __init__(self, num_classes, hidden: int = 32):
        super().__init__()
        self.image = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU())
        self.features = nn.Sequential(nn.Linear(4, hidden), nn.ReLU())
        self.head = nn.Linear(2 * hidden, num_classes)

    def forward(self, x):
        return self.head(torch.cat([self.image(x["image"]), self.features(x["features"])], dim=1))


class Tags(Dataset):
    """Multi-label: x [12] with multi-hot float targets [5] (each label on when its part of x is positive)."""

    def __init__(self, train: bool = True, size: int = 512):
        g = _generator(train)
        self.x = torch.randn(size, 12, generator=g)
        self.y = (self.x.view(size, 4, 3).sum(2) > 0).float()
        self.y = torch.cat([self.y, (self.x[:, :2].sum(1, keepdim=True) > 0).float()], dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]
