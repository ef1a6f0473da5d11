"""torchvision's ResNet-18 and AlexNet, adapted to the dataset's channels, image size and classes.

Small images (under 64 px, e.g. 28x28 or 32x32) get the usual CIFAR adaptation: a 3x3 stride-1 first
convolution and, for ResNet, no initial max-pool; otherwise the downsampling leaves nothing to classify."""
from torch import nn
from torchvision import models

from framework.models.shapes import flat_features, image_shape

_SMALL = 64


def resnet18(in_shape, num_classes: int):
    channels, height, _ = image_shape(in_shape, "resnet18")
    model = models.resnet18(weights=None, num_classes=num_classes)
    if height < _SMALL:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = nn.Identity()
    elif channels != 3:
        model.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    flat_features(nn.Sequential(*list(model.children())[:-1]), in_shape, "resnet18")
    return model


def alexnet(in_shape, num_classes: int):
    channels, height, _ = image_shape(in_shape, "alexnet")
    model = models.alexnet(weights=None, num_classes=num_classes)
    if height < _SMALL:
        model.features[0] = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1)
    elif channels != 3:
        model.features[0] = nn.Conv2d(channels, 64, kernel_size=11, stride=4, padding=2)
    flat_features(model.features, in_shape, "alexnet")
    return model
