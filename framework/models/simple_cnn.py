"""The SimpleCNN of the MNIST DDP tutorials: one conv 32@3x3 (pad 1), ReLU, maxpool, one linear layer."""
from torch import nn

from framework.models.shapes import flat_features, image_shape


class SimpleCNN(nn.Module):
    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "simple_cnn")
        self.features = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(flat_features(self.features, in_shape, "simple_cnn"), num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))
