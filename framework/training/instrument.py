"""Telemetry's hooks into what parallelize() returned, and the per-GPU facts gathered once. The wait clock tells a
rank's own work from its waits for the others (framework/telemetry/wait_clock.py, replica_clock.py); it is attached
by what the engine is, not wired by each strategy. No clock where the engine's waits cannot be told apart from its
work (single, fsdp, DeepSpeed ZeRO-3): busy is then the whole step, and no wait is reported."""
from __future__ import annotations

from torch import nn

from framework.config.trainer import TrainerConfig
from framework.telemetry.per_gpu import PerGpu, local_slots
from framework.telemetry.replica_clock import ReplicaClock, time_replicas
from framework.telemetry.traffic import Traffic
from framework.telemetry.wait_clock import WaitClock, start_when_gradients_are_done, stop_after, timed_allreduce
from framework.training.engine import CountsTraffic, OwnClock, ProcessGroup, SlotSplit, Wrapped, slot_sizes


def wait_clock(wrapped: Wrapped, group: ProcessGroup):
    """The clock for this engine, its hooks attached (before the first forward); None where none fits."""
    model, optimizer = wrapped.model, wrapped.optimizer
    if isinstance(wrapped, OwnClock):  # pipeline parallel: each stage's compute, bubble and communication
        return wrapped.wait_clock()
    if isinstance(wrapped, SlotSplit):  # dp: every replica's forward and backward on its own GPU
        clock = ReplicaClock(group.devices)
        model.register_forward_pre_hook(lambda *_: clock.begin_micro_batch())  # before the replicas' own hooks
        time_replicas(model.module if isinstance(model, nn.DataParallel) else model, clock, len(group.devices) > 1)
        return clock
    if isinstance(model, nn.parallel.DistributedDataParallel):  # its comm hook sees each bucket become ready
        clock = WaitClock(group.device, ends_with_backward=True)
        hook = getattr(wrapped, "comm_hook", None)  # ddp's own (strategy.compression) keeps the clock; DDP takes one
        if hook is not None:
            hook.clock = clock
        else:
            model.register_comm_hook(clock, timed_allreduce)
        return clock
    if callable(getattr(optimizer, "synchronize", None)) and hasattr(optimizer, "skip_synchronize"):
        # Horovod's DistributedOptimizer: gradients reduced from their hooks, waited for in synchronize()
        clock = WaitClock(group.device)
        start_when_gradients_are_done(wrapped.module, clock)
        stop_after(optimizer, "synchronize", clock)
        return clock
    if callable(getattr(model, "zero_optimization_stage", None)) and model.zero_optimization_stage() < 3:
        # DeepSpeed ZeRO 0-2 reduce inside the backward of an accumulation's last micro-batch. ZeRO-3 gathers every
        # layer's parameters in forward, inside its prefetching, where a wait cannot be told from work.
        clock = WaitClock(group.device, ends_with_backward=True)
        start_when_gradients_are_done(wrapped.module, clock)
        return clock
    return None


def gradient_traffic(wrapped: Wrapped) -> Traffic | None:
    """What counts this engine's gradient bytes (framework/telemetry/traffic.py), where it counts them (CountsTraffic:
    ddp's hook, Horovod's compressor, FSDP2's reduce-scatters); None elsewhere."""
    return wrapped.traffic if isinstance(wrapped, CountsTraffic) else None


def timed_barrier(group: ProcessGroup, clock):
    """group.barrier, its time counted as waiting on the clock (one that only measures per-process waits)."""
    if not isinstance(clock, WaitClock):
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
