"""BatchNorm under the world-size-invariant mode. Each micro-shard's forward normalizes over that shard alone (ghost
batch norm, the same on every world size), but the running statistics are updated by each rank from its own shards,
in an order and on a rank that depend on the world size; so a model that keeps them is refused until the mode
combines them (issue 58)."""
from __future__ import annotations

from torch import nn

from framework.common.errors import ConfigError


def refuse_running_statistics(model: nn.Module, model_name: str) -> None:
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._NormBase) and module.track_running_stats:
            raise ConfigError(
                f"model={model_name} is not allowed with trainer.invariant=true: its {type(module).__name__} "
                f"'{name}' keeps running statistics, which each rank updates from its own micro-shards; use a model "
                "without them (track_running_stats=False, or GroupNorm/LayerNorm), or leave trainer.invariant out")
