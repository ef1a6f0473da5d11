"""LeNet as in d2l's data-parallel chapter: conv 20@3x3, avgpool, conv 50@5x5, avgpool, fc 128, fc classes."""
from torch import nn

from framework.models.shapes import flat_features, image_shape


class LeNet(nn.Module):
    channels_last_helps = True  # on the CPU: 1.25-1.38x steps/s (bench/speedups.py); see framework/training/speedups.py

    def __init__(self, in_shape, num_classes: int):
        super().__init__()
        channels, _, _ = image_shape(in_shape, "lenet")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 20, kernel_size=3), nn.ReLU(inplace=True), nn.AvgPool2d(2, 2),
            nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(inplace=True), nn.AvgPool2d(2, 2),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(flat_features(self.features, in_shape, "lenet"), 128), nn.ReLU(inplace=True), nn.Linear(128, num_classes)
        )

    def forward(self, x):
        return self.classifier(self.features(x))
