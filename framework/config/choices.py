"""The settings that take one of a few words, as Enums: a schema field typed with one (`precision: PrecisionChoice`) makes
OmegaConf refuse any other word while Hydra composes the config, and when the driver types one.

Each member's name is its value (OmegaConf takes a member by its name: `trainer.precision=bf16`), and a member is
that plain string everywhere else: it equals it (`precision == "bf16"`), hashes like it (dict lookups by the string),
and str(), f-strings, repr(), json.dumps and TensorBoard's hparams give the bare word, never `PrecisionChoice.bf16`
(Python 3.11 made format() of a str-mixin Enum give the member's name; enum.StrEnum needs 3.11). A member pickles by
its class (settings travel to the workers pickled)."""
from __future__ import annotations

import enum


class Choice(str, enum.Enum):
    """Base of the choice Enums: members are str, and print and compare as their value."""

    __str__ = str.__str__
    __format__ = str.__format__
    __repr__ = str.__repr__


class PrecisionChoice(Choice):
    """trainer.precision's words (what runs them is framework/training/precision.py's Precision)."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # needs CUDA (GradScaler)


class Accelerator(Choice):
    auto = "auto"  # the GPU when there is one
    cpu = "cpu"
    gpu = "gpu"


class OnNonfinite(Choice):
    stop = "stop"
    skip = "skip"


class Schedule(Choice):
    constant = "constant"
    warmup_cosine = "warmup_cosine"
    torch = "torch"  # lr_schedule.scheduler: a torch.optim.lr_scheduler class by _target_


class LrScaling(Choice):
    none = "none"
    linear = "linear"


class Backend(Choice):
    auto = "auto"  # nccl with GPUs, gloo without
    nccl = "nccl"
    gloo = "gloo"


class RdzvBackend(Choice):
    c10d = "c10d"
    static = "static"


class Compression(Choice):
    """strategy.compression: what gradients travel as (each engine allows its own: framework/config/strategy_options.py)."""

    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"
    powersgd = "powersgd"  # ddp: low-rank gradients (torch's PowerSGD hook, with error feedback)


class ReduceOp(Choice):
    average = "average"
    sum = "sum"
    adasum = "adasum"


class InvariantReduce(Choice):
    """trainer.invariant_reduce: how the world-size-invariant mode sums the K micro-shards' gradients
    (framework/training/invariant/)."""

    fixed_point = "fixed_point"  # integers at a per-tensor power-of-two scale, one int64 all-reduce: 2x fp32's bytes
    gathered = "gathered"  # every shard's gradient gathered, one fixed tree of float additions: K/2 x fp32's bytes
