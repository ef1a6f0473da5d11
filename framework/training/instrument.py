"""Telemetry's hooks into what parallelize() returned, and the per-GPU facts gathered once. The wait clock tells a
rank's own work from its waits for the others (framework/telemetry/wait_clock.py, replica_clock.py, pipeline_clock.py,
framework/strategies/mesh/comm_clock.py): each engine makes its own (OwnClock), so nothing here asks what an engine
is. No clock where the engine's waits cannot be told apart from its work (single, DeepSpeed ZeRO-3): busy is then the
whole step, and no wait is reported."""
from __future__ import annotations

from framework.config.trainer import TrainerConfig
from framework.telemetry.per_gpu import PerGpu, local_slots
from framework.telemetry.traffic import Traffic
from framework.training.engine import CountsTraffic, OwnClock, ProcessGroup, Wrapped, slot_sizes


def wait_clock(wrapped: Wrapped, group: ProcessGroup):
    """The engine's clock, its hooks attached (before the first forward); None where it has none."""
    return wrapped.wait_clock(group) if isinstance(wrapped, OwnClock) else None


def gradient_traffic(wrapped: Wrapped) -> Traffic | None:
    """What counts this engine's gradient bytes (framework/telemetry/traffic.py), where it counts them (CountsTraffic:
    ddp's hook, Horovod's compressor, FSDP2's reduce-scatters); None elsewhere."""
    return wrapped.traffic if isinstance(wrapped, CountsTraffic) else None


def timed_barrier(group: ProcessGroup, clock):
    """group.barrier, its time counted as waiting on the clock (one that measures per-process waits: it can block)."""
    if not callable(getattr(clock, "blocking", None)):
        return group.barrier

    def barrier() -> None:
        with clock.blocking():
            group.barrier()

    return barrier


def per_gpu(group: ProcessGroup, wrapped: Wrapped, micro_batch: int, model_flops, options: TrainerConfig,
            convolutions: bool, say) -> PerGpu:
    """Every rank, once (it gathers each slot's host, device and peak): what tells one GPU from another at a log
    boundary; rank 0 says what it can report. model_flops: count_flops() of the user's module on rank 0; options:
    trainer.precision and the straggler_* rule."""
    precision = options.precision
    used = len(slot_sizes(wrapped, micro_batch))
    mine = local_slots(group.devices, used, precision, convolutions)
    slots = [s for rank_slots in group.gather_objects(mine) for s in rank_slots]
    flops = model_flops if isinstance(model_flops, float) else None
    meters = PerGpu(slots, flops, options.straggler_threshold, options.straggler_intervals,
                    options.straggler_min_gap_ms)
    if group.is_main:
        if used < len(group.devices):
            say(f"a micro-batch of {micro_batch} splits into {used} chunk(s), so {used} of the {len(group.devices)} "
                "GPUs of this process train (nn.DataParallel gives each at least one sample); raise trainer.batch_size "
                "to use them all")
        say(meters.flops_line(model_flops, precision, convolutions))
    return meters
