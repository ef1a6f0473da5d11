"""The world-size-invariant mode's refusals (issue 58: trainer.invariant, trainer.micro_shards), each one line naming
the key, its value and what is allowed, made in the driver before any worker starts (framework/preflight.py)."""
from __future__ import annotations

from framework.common.errors import ConfigError
from framework.config.strategy_options import MESH_TARGET, SingleOptions, StrategyOptions


def _reduction_replaceable(options: StrategyOptions) -> bool:
    """single, and the mesh on its 1-D replicate mesh (ddp: DDP itself, whose all-reduce the mode replaces). The
    others reduce in an order of their own (fsdp, hsdp, tp and pp: reduce-scatters over the mesh; dp: replicas summed
    on one GPU; deepspeed and horovod: their own buckets)."""
    if options._target_ == SingleOptions._target_:
        return True
    return options._target_ == MESH_TARGET and getattr(options, "runs_ddp", False)


def check_invariant(trainer, options: StrategyOptions, dp_ranks: int, cuda: bool = False) -> None:
    """trainer: the trainer's settings (micro_shards, batch_size, grad_accum, deal_as_ranks, precision); options: the
    strategy's; dp_ranks: the data-parallel ranks this run starts; cuda: whether it trains on GPUs."""
    mode, micro_shards = "trainer.invariant=true", trainer.micro_shards
    if not _reduction_replaceable(options):
        raise ConfigError(f"strategy={options.name} is not allowed with {mode}: the world-size-invariant mode runs "
                          "under strategy=single or strategy=ddp (this engine reduces gradients in an order of its "
                          "own); use one of them, or leave trainer.invariant out")
    if micro_shards < 1 or micro_shards % dp_ranks:
        raise ConfigError(f"trainer.micro_shards={micro_shards} is not allowed with {dp_ranks} data-parallel ranks: "
                          "it must be a multiple of every worker count the run may train on (e.g. 8 for 1, 2, 4 or "
                          "8 workers)")
    if trainer.batch_size % micro_shards:
        raise ConfigError(f"trainer.batch_size={trainer.batch_size} is not allowed with trainer.micro_shards="
                          f"{micro_shards}: each micro-shard is batch_size / micro_shards samples; use a multiple of "
                          f"{micro_shards}")
    if trainer.grad_accum != 1:
        raise ConfigError(f"trainer.grad_accum={trainer.grad_accum} is not allowed with {mode}: each rank "
                          "accumulates its micro-shards (micro_shards / ranks of them a step); set "
                          "trainer.micro_shards instead")
    if trainer.deal_as_ranks is not None:
        raise ConfigError(f"trainer.deal_as_ranks={trainer.deal_as_ranks} is not allowed with {mode}: one process "
                          "trains every micro-shard in turn already; leave trainer.deal_as_ranks out")
    if trainer.precision == "fp16":
        raise ConfigError(f"trainer.precision=fp16 is not allowed with {mode}: GradScaler's unscaling and skipped "
                          "steps come before the exact sum; allowed: fp32 or bf16")
    if cuda and trainer.deterministic is not True:
        raise ConfigError(f"trainer.deterministic={str(trainer.deterministic).lower()} is not allowed with {mode} on GPUs: a "
                          "kernel without a deterministic algorithm changes a shard's gradient run to run; set "
                          "trainer.deterministic=true")
    if getattr(options, "sync_batchnorm", False):
        raise ConfigError(f"strategy.sync_batchnorm=true is not allowed with {mode}: it normalizes over the ranks, "
                          "whose number changes; leave it out")
    if getattr(options, "compression", "none") != "none":
        raise ConfigError(f"strategy.compression={options.compression} is not allowed with {mode}: the gradients "
                          "are summed exactly, not compressed; allowed: none")
