"""The DeepSpeed JSON config, generated from the trainer config (one source of truth) and merged with
strategy.config for everything else. Plain Python: the driver checks it without importing DeepSpeed."""
from __future__ import annotations

from typing import Any

from framework.config.strategy_options import DeepSpeedOptions
from framework.config.trainer import TrainerConfig
from framework.errors import ConfigError

CONFIG_FILE = "deepspeed_config.json"
_NEVER = 2**31 - 1  # DeepSpeed's own progress print; our loop logs instead

# DeepSpeed key (dotted) -> the config key it is generated from. strategy.config may repeat these only with
# the same value; a different value would make DeepSpeed train something other than what the config says.
_OWNED = {
    "train_batch_size": "trainer.batch_size",
    "train_micro_batch_size_per_gpu": "trainer.batch_size",
    "gradient_accumulation_steps": "trainer.grad_accum",
    "gradient_clipping": "trainer.grad_clip",
    "bf16.enabled": "trainer.precision",
    "fp16.enabled": "trainer.precision",
    "zero_optimization.stage": "strategy.zero_stage",
    "zero_optimization.offload_optimizer.device": "strategy.offload_optimizer",
}
# Blocks that would replace a part this framework builds itself.
_REFUSED = {
    "optimizer": "the optimizer comes from the optimizer group (optimizer=adam|adamw|sgd, optimizer.lr=...)",
    "scheduler": "a DeepSpeed scheduler would change the lr behind the training loop's back",
}


def generated_config(options: DeepSpeedOptions, trainer: TrainerConfig, processes: int) -> dict:
    micro_batch = trainer.batch_size // (processes * trainer.grad_accum)
    zero: dict[str, Any] = {"stage": options.zero_stage}
    if options.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    return {
        "train_batch_size": trainer.batch_size,
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": trainer.grad_accum,
        "gradient_clipping": float(trainer.grad_clip or 0.0),
        "bf16": {"enabled": trainer.precision == "bf16"},
        "fp16": {"enabled": trainer.precision == "fp16"},
        "zero_optimization": zero,
        # The optimizer is a torch optimizer from the optimizer group; DeepSpeed supports it, it just does not
        # test every one (and with offload it would insist on its own CPU Adam).
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": _NEVER,
        "wall_clock_breakdown": False,
    }


def _lookup(tree: dict, dotted: str):
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _ABSENT
        node = node[part]
    return node


_ABSENT = object()


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def deepspeed_config(options: DeepSpeedOptions, trainer: TrainerConfig, processes: int) -> dict:
    """The final config: generated keys, then strategy.config merged in. Raises ConfigError when
    strategy.config contradicts a generated key or replaces a part the framework owns."""
    generated, extra = generated_config(options, trainer, processes), dict(options.config)
    settings = {"trainer": trainer, "strategy": options}
    for key, why in _REFUSED.items():
        if key in extra:
            raise ConfigError(f"strategy.config.{key} is not allowed: {why}")
    for key, source in _OWNED.items():
        theirs, ours = _lookup(extra, key), _lookup(generated, key)
        if theirs is _ABSENT:
            continue
        if ours is _ABSENT:  # offload_optimizer.device when strategy.offload_optimizer=false
            ours = None
        if theirs != ours:
            group, _, name = source.partition(".")
            raise ConfigError(
                f"strategy.config.{key}={theirs!r} is not allowed: it contradicts {source}="
                f"{getattr(settings[group], name)!r}, from which this key is generated ({ours!r}); "
                f"set {source} instead"
            )
    return _merge(generated, extra)
