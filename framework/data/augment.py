"""Batched augmentation on the training device, for `dataset.augment` (both input paths; evaluation never
augments). One call per micro-batch, a few tensor ops for the whole batch, no per-sample Python: the
random-crop-with-padding and horizontal-flip recipe of the fastest CIFAR-10 training scripts.

Randomness comes from the generator the loader passes in, seeded from (trainer.seed, epoch, rank, batch), so a
run is repeatable, every rank and epoch sees different crops, and a resumed run gets exactly the same ones. A
dataset's own per-sample transforms draw in the DataLoader's worker processes, which torch seeds from the
loader's generator (random, numpy and torch, per worker): loader_generator seeds it from (trainer.seed, rank)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from framework.config.components import build_component
from framework.config.rules import at_least, one_of, require
from framework.common.errors import ConfigError


def build_augment(node, in_shape):
    """dataset.augment (null: none): a batched on-device augmentation, checked against the input shape."""
    if node is None:
        return None
    augment = build_component(node, "dataset.augment")
    if not callable(augment):
        raise ConfigError(f"dataset.augment._target_={node['_target_']} is not allowed: it built a "
                          f"{type(augment).__name__}, which cannot be called as augment(batch, generator)")
    if hasattr(augment, "check"):
        augment.check(tuple(in_shape))
    return augment


class RandomCropFlip:
    def __init__(self, padding: int = 4, flip: bool = True, pad_mode: str = "reflect"):
        self.padding = require("dataset.augment.padding", padding, at_least(0))
        self.pad_mode = require("dataset.augment.pad_mode", pad_mode, one_of("reflect", "constant", "replicate"))
        self.flip = bool(flip)

    def check(self, in_shape: tuple[int, ...]) -> None:
        if len(in_shape) != 3:
            raise ConfigError(f"dataset.augment is not allowed for inputs of shape {list(in_shape)}: random crops and "
                              "flips need images (channels, height, width)")
        if self.pad_mode == "reflect" and self.padding >= min(in_shape[1:]):
            raise ConfigError(f"dataset.augment.padding={self.padding} is not allowed with pad_mode=reflect for "
                              f"{in_shape[1]}x{in_shape[2]} images: it must be smaller than the image")

    def __call__(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        # Crop and flip are one gather: output pixel (h, w) of sample n reads padded pixel
        # (h + dy[n], w' + dx[n]), with w' = w or, for a mirrored sample, W-1-w.
        n, c, h, w = x.shape
        p = self.padding
        padded = F.pad(x, (p, p, p, p), mode=self.pad_mode) if p else x
        shifts = torch.randint(0, 2 * p + 1, (2, n, 1, 1), device=x.device, generator=generator)
        cols = torch.arange(w, device=x.device).view(1, 1, w)
        if self.flip:
            mirrored = torch.rand(n, device=x.device, generator=generator) < 0.5
            cols = torch.where(mirrored.view(n, 1, 1), w - 1 - cols, cols)
        rows = torch.arange(h, device=x.device).view(1, h, 1) + shifts[0]
        index = (rows * (w + 2 * p) + cols + shifts[1]).view(n, 1, h * w).expand(n, c, h * w)
        return padded.reshape(n, c, -1).gather(2, index).view(n, c, h, w)


def batch_generator(device: torch.device, seed: int, epoch: int, rank: int, batch: int) -> torch.Generator:
    """The generator for one micro-batch: a pure function of where the batch is, so a resume repeats it."""
    return torch.Generator(device=device).manual_seed(((seed * 1_000_003 + epoch) * 65_537 + rank) * 1_000_033 + batch)


def loader_generator(seed: int, rank: int) -> torch.Generator:
    """The DataLoader's generator for one rank: torch draws each iterator's worker seeds from it, so a dataset's
    random transforms repeat run to run and differ between ranks. Without it torch draws them from the process's
    global generator, which every rank seeds alike and whose state depends on what drew from it before."""
    return torch.Generator().manual_seed(seed * 1_000_003 + rank)
