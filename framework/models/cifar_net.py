"""The Net of PyTorch's CIFAR-10 tutorial: conv 6@5x5, pool, conv 16@5x5, pool, fc 120, 84, classes."""
from torch import nn

from framework.models.shapes import flat_features, image_shape


class CifarNet(nn.Module):
    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "cifar_net")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(flat_features(self.features, in_shape, "cifar_net"), 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))
