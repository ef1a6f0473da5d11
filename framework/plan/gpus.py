"""The GPU a plan is compared with: plan.gpu by name from a small table of cards (their memory as sold), else the
first GPU this machine has (its total memory as torch reports it), else none. A card's memory is not all the
tensors': the CUDA context, the allocator's rounding and the libraries' workspaces take some (its kind's device
constants, framework/plan/device_constants.py: estimates until measured)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from framework.common.errors import ConfigError
from framework.plan.device_constants import DeviceConstants, constants_of

GIB = 2 ** 30

CARDS_GIB = {
    "T4-16GB": 16, "V100-16GB": 16, "V100-32GB": 32, "A10-24GB": 24, "L4-24GB": 24, "RTX3090-24GB": 24,
    "RTX4090-24GB": 24, "A100-40GB": 40, "A100-80GB": 80, "L40S-48GB": 48, "H100-80GB": 80, "H100-94GB": 94,
    "H200-141GB": 141, "B200-180GB": 180, "MI300X-192GB": 192,
}


@dataclass(frozen=True)
class Gpu:
    name: str
    memory: int  # bytes
    constants: DeviceConstants

    def room(self, workers: int) -> int:
        """Bytes the tensors of one of `workers` ranks may take at their peak: the memory less the device constants."""
        return self.constants.room(self.memory, workers)

    def fits(self, peak: int, workers: int) -> bool:
        return peak <= self.room(workers)


def chosen_gpu(name: str | None) -> Gpu | None:
    """plan.gpu's card; without one, this machine's first GPU; None where it has none."""
    if name:
        by_lower = {card.lower(): card for card in CARDS_GIB}
        card = by_lower.get(name.lower())
        if card is None:
            raise ConfigError(f"plan.gpu={name} is not allowed: not a card the plan knows; known: "
                              f"{', '.join(CARDS_GIB)}")
        return Gpu(card, CARDS_GIB[card] * GIB, constants_of(card))
    if torch.cuda.is_available():
        return this_machines_gpu()
    return None


def this_machines_gpu() -> Gpu:
    name = torch.cuda.get_device_name(0)
    return Gpu(name, torch.cuda.get_device_properties(0).total_memory, constants_of(name))
