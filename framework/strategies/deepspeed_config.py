"""The DeepSpeed JSON config, generated from the trainer config (one source of truth) and merged with
strategy.config for everything else. Plain Python: the driver checks it without importing DeepSpeed."""
from __future__ import annotations

from typing import Any

from framework.config.strategy_options import DeepSpeedOptions
from framework.config.trainer import TrainerConfig
from framework.common.errors import ConfigError

CONFIG_FILE = "deepspeed_config.json"
_NEVER = 2**31 - 1  # DeepSpeed's own progress print; our loop logs instead
_AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}  # DeepSpeed's names (its DtypeEnum)

# DeepSpeed key (dotted) -> the config key it is generated from. strategy.config may repeat these only with
# the same value; a different value would make DeepSpeed train something other than what the config says.
_OWNED = {
    "train_batch_size": "trainer.batch_size",
    "train_micro_batch_size_per_gpu": "trainer.batch_size",
    "gradient_accumulation_steps": "trainer.grad_accum",
    "gradient_clipping": "trainer.grad_clip",
    "bf16.enabled": "trainer.precision",
    "fp16.enabled": "trainer.precision",
    "torch_autocast.enabled": "trainer.precision",
    "torch_autocast.dtype": "trainer.precision",
    "zero_optimization.stage": "strategy.zero_stage",
    "zero_optimization.offload_optimizer.device": "strategy.offload_optimizer",
}
# DeepSpeed's 1-bit optimizers (their config's type, lower case): gradient compression that needs NCCL or MPI
_COMPRESSED_OPTIMIZERS = ("onebitadam", "zerooneadam", "onebitlamb")
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
        # Mixed precision is DeepSpeed's own torch_autocast: engine.forward runs under torch.autocast while the
        # parameters (and so checkpoints and weights) stay fp32, as under every other strategy; fp16 gets
        # DeepSpeed's GradScaler. Its bf16/fp16 sections would cast the parameters instead and leave the inputs to
        # the caller (fp32 images into a bf16 Conv2d fail), and an outer torch.autocast is switched off inside
        # the engine (DeepSpeed >= 0.17.6), so neither is used.
        "torch_autocast": {"enabled": trainer.precision != "fp32",
                           **({"dtype": _AUTOCAST_DTYPES[trainer.precision]} if trainer.precision != "fp32" else {})},
        "bf16": {"enabled": False},
        "fp16": {"enabled": False},
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
    kind = extra.get("optimizer", {}).get("type") if isinstance(extra.get("optimizer"), dict) else None
    if str(kind).lower() in _COMPRESSED_OPTIMIZERS:
        raise ConfigError(f"strategy.config.optimizer.type={kind} is not allowed: DeepSpeed's compressed optimizers "
                          "(OneBitAdam, ZeroOneAdam, OneBitLamb) need NCCL or MPI and would replace the optimizer "
                          "group's optimizer; gradient compression: strategy=ddp strategy.compression=fp16|bf16|powersgd")
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
