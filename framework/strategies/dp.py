"""nn.DataParallel: one process, the model replicated on every visible GPU, each batch split across them."""
from __future__ import annotations

import torch
from torch import nn

from framework.config_checks import int_list
from framework.errors import ConfigError
from framework.strategies.base import Strategy


class DataParallelStrategy(Strategy):
    name = "dp"

    def validate(self) -> None:
        ids = int_list(self.cfg, "strategy.device_ids", 0, optional=True)
        if ids and self.use_cuda and max(ids) >= torch.cuda.device_count():
            raise ConfigError(
                f"strategy.device_ids={ids} is not allowed: this machine has {torch.cuda.device_count()} GPUs "
                f"(ids 0..{torch.cuda.device_count() - 1})"
            )

    def _device_ids(self) -> list[int]:
        return list(self.options.device_ids or range(torch.cuda.device_count())) if self.use_cuda else []

    def describe(self) -> str:
        ids = self._device_ids()
        if not ids:
            return "1 process on the CPU (no GPU in use, so nn.DataParallel runs one replica there)"
        return f"1 process, nn.DataParallel over GPU(s) {ids} (one replica each)"

    def setup(self) -> None:
        if self.use_cuda:
            self.device_ids = self._device_ids()
            self.device = torch.device("cuda", self.device_ids[0])
        else:
            self.device_ids = []
            self.device = torch.device("cpu")
            print("strategy=dp: no GPU in use, so nn.DataParallel runs the model on the CPU (one replica)", flush=True)

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return nn.DataParallel(model, device_ids=self.device_ids or None) if self.device_ids else model

    def local_slots(self) -> int:
        return max(1, len(self.device_ids))

    def slot_sizes(self, batch: int) -> list[int]:
        # nn.DataParallel scatters with torch.chunk semantics: ceil(batch / n) per replica, the rest on the last ones.
        if len(self.device_ids) <= 1:
            return [batch]
        return [len(c) for c in torch.arange(batch).chunk(len(self.device_ids))]
