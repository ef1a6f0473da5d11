"""strategy.compression under ddp: what gradients travel as, through torch's DDP communication hooks (its fp16 and bf16
wrappers, PowerSGD with error feedback and warm start), in one hook that also keeps the per-rank wait clock
(framework/telemetry/wait_clock.py: each bucket that becomes ready moves the mark; after the last one this rank only
waits) and counts the bytes each all-reduce is handed (framework/telemetry/traffic.py).

What is counted is the tensor handed to the all-reduce: the bucket (none), its fp16 or bf16 copy (torch's wrappers
hand our all-reduce the cast bucket), or for PowerSGD the elements its hook all-reduces as it records them itself
(PowerSGDState's counter: the uncompressed matrices and vectors, then the P and Q factors).

PowerSGD keeps state per gradient bucket: each rank's error feedback (what compression left out of its gradients)
and the factor Q that warm start continues from. DDP lays its buckets out twice in a process (after the first step it
rebuilds them in the order gradients became ready), and a resumed run starts from the first layout again, so that
state follows the parameters, not the bucket index: when a bucket's parameters change, its state is split by
parameter and put back into whichever bucket holds them when that bucket is next reduced. Checkpoints hold it per
parameter, each rank writing and reading its own piece (framework/training/checkpointing.py)."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from framework.config.strategy_options import PowerSGDOptions
from framework.telemetry.traffic import Traffic, nbytes

# torch's default: a gradient matrix n x m is compressed only where (n + m) x rank x 2 < n x m
MIN_COMPRESSION_RATE = 2


class GradientHook:
    """What DDP hands the hook on every bucket: the compression, the wait clock (None until telemetry attaches one:
    framework/training/instrument.py), the traffic counter and PowerSGD's state."""

    def __init__(self, compression: str, powersgd: PowerSGDOptions, parameters: list[torch.nn.Parameter]):
        self.compression = compression
        self.clock = None
        self.params = parameters
        self.index = {id(p): i for i, p in enumerate(parameters)}
        self.powersgd: PowerSGDState | None = None
        label = str(compression)
        if compression == "powersgd":
            # torch counts the steps it has reduced; compression starts once that count reaches start_powerSGD_iter
            self.powersgd = PowerSGDState(
                None, matrix_approximation_rank=powersgd.rank, start_powerSGD_iter=powersgd.start_step - 1,
                min_compression_rate=MIN_COMPRESSION_RATE, use_error_feedback=powersgd.error_feedback,
                warm_start=powersgd.warm_start, random_seed=0)
            label = f"powersgd rank {powersgd.rank}"
        self.traffic = Traffic(label)
        self.send = {"none": counted_allreduce, "fp16": default_hooks.fp16_compress_wrapper(counted_allreduce),
                     "bf16": default_hooks.bf16_compress_wrapper(counted_allreduce),
                     "powersgd": powersgd_allreduce}[str(compression)]
        self.layouts: dict[int, tuple[int, ...]] = {}  # bucket index -> the parameters its PowerSGD state is laid out for
        self.pending: dict[int, dict[str, torch.Tensor]] = {}  # parameter -> its state, not yet in a bucket
        self.reduced: set[int] = set()  # buckets reduced in this step (their futures may still write their state)
        self.in_flight = None  # the last bucket's PowerSGD future, where one bucket's chain must end before the next

    # ---- PowerSGD's state follows the parameters -----------------------------------------------------------------
    def follow_layout(self, bucket) -> None:
        """Before PowerSGD reduces `bucket`: its state laid out for the parameters the bucket holds now."""
        b = bucket.index()
        layout = tuple(self.index[id(p)] for p in bucket.parameters())
        known = self.layouts.get(b)
        if known != layout:
            if known is not None:  # DDP rebuilt its buckets: every bucket not yet reduced in this step follows
                for other in [i for i in self.layouts if i not in self.reduced or i == b]:
                    self.pending.update(self._pieces(other))
                    self._drop(other)
            self._assemble(bucket, layout)
            self.layouts[b] = layout
        self.reduced.add(b)
        if bucket.is_last():  # DDP reduces bucket 0 last: the step's last call
            self.reduced.clear()

    def _pieces(self, b: int) -> dict[int, dict[str, torch.Tensor]]:
        """Bucket b's PowerSGD state, split by parameter (copies)."""
        state, layout = self.powersgd, self.layouts[b]
        shapes = [self.params[i].shape for i in layout]
        error, q = state.error_dict.get(b), state.q_memory_dict.get(b)
        if error is not None and error.numel() != sum(s.numel() for s in shapes):
            error = None  # a bucket laid out otherwise than its parameters (padding): its error is not split
        pieces: dict[int, dict[str, torch.Tensor]] = {i: {} for i in layout}
        offset = 0
        for i, shape in zip(layout, shapes):
            if error is not None:
                pieces[i]["error"] = error[offset:offset + shape.numel()].clone()
            offset += shape.numel()
        if q is not None:
            for position, q_slice in q_slices(shapes, state.matrix_approximation_rank).items():
                pieces[layout[position]]["q"] = q[q_slice].clone()
        return {i: piece for i, piece in pieces.items() if piece}

    def _drop(self, b: int) -> None:
        for memory in (self.powersgd.error_dict, self.powersgd.p_memory_dict, self.powersgd.q_memory_dict):
            memory.pop(b, None)
        self.layouts.pop(b, None)

    def _assemble(self, bucket, layout: tuple[int, ...]) -> None:
        """Bucket b's state from its parameters' pieces: error feedback (zeros for a parameter without one), and the
        warm-start factors where every compressed matrix of the bucket has its own (else torch draws new ones)."""
        pieces = [self.pending.pop(i, {}) for i in layout]
        if not any(pieces):
            return
        state, b, buffer = self.powersgd, bucket.index(), bucket.buffer()
        shapes = [self.params[i].shape for i in layout]
        like = dict(device=buffer.device, dtype=buffer.dtype)
        if state.use_error_feedback and any("error" in p for p in pieces) and buffer.numel() == sum(
                s.numel() for s in shapes):
            state.error_dict[b] = torch.cat([p["error"].to(**like) if "error" in p else torch.zeros(s.numel(), **like)
                                             for p, s in zip(pieces, shapes)])
        slices = q_slices(shapes, state.matrix_approximation_rank)
        if state.warm_start and slices and all(
                "q" in pieces[pos] and pieces[pos]["q"].numel() == s.stop - s.start for pos, s in slices.items()):
            ordered = sorted(slices, key=lambda pos: slices[pos].start)
            state.q_memory_dict[b] = torch.cat([pieces[pos]["q"].to(**like) for pos in ordered])
            # P is recomputed from Q before it is read; torch only asks whether the bucket has one
            state.p_memory_dict[b] = torch.empty(p_elements(shapes, state.matrix_approximation_rank), **like)

    # ---- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state (CPU tensors and plain values), at a step boundary (no bucket's future pending)."""
        if self.powersgd is None:
            return {"compression": self.traffic.label}
        state = self.powersgd
        pieces = {i: dict(p) for i, p in self.pending.items()}
        for b in self.layouts:
            for i, piece in self._pieces(b).items():
                pieces.setdefault(i, {}).update(piece)
        _, keys, position, has_gauss, cached = state.rng.get_state()
        return {"compression": self.traffic.label, "holds": "PowerSGD's error feedback and warm-start factors",
                "rank": state.matrix_approximation_rank,
                "iter": state.iter, "numel": [state.total_numel_before_compression, state.total_numel_after_compression],
                "rng": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                        "has_gauss": int(has_gauss), "cached": float(cached)},
                "pieces": {i: {k: t.detach().cpu() for k, t in p.items()} for i, p in pieces.items()}}

    def load_state_dict(self, mine: dict | None, saved_world: int, world_size: int, step: int) -> str:
        """This rank's saved state (rank 0's where `saved_world`, the ranks that wrote it, is not world_size; None:
        the checkpoint holds none); what was reset, in words ('' for nothing)."""
        was = mine.get("compression") if mine else None
        label, state = self.traffic.label, self.powersgd
        changed = f"strategy.compression was {was}, now {label}" if was and was != label else ""
        if state is None:
            if mine and "pieces" in mine:
                return f"{changed}: the checkpoint's PowerSGD state (error feedback, warm-start factors) is dropped"
            return changed
        if not mine or "pieces" not in mine:
            state.iter = step  # the steps reduced so far, as if this run had reduced them
            if step < state.start_powerSGD_iter:
                return changed
            return (f"{changed or 'the checkpoint holds no PowerSGD state'}: PowerSGD goes on from step {step + 1} "
                    "with no error feedback and fresh factors")
        state.iter = mine["iter"]
        state.total_numel_before_compression, state.total_numel_after_compression = mine["numel"]
        rng = mine["rng"]
        state.rng.set_state(("MT19937", rng["keys"].numpy().astype(np.uint32), rng["position"], rng["has_gauss"],
                             rng["cached"]))
        same_world, same_rank = saved_world == world_size, mine["rank"] == state.matrix_approximation_rank
        resets = []
        if not same_world and any("error" in p for p in mine["pieces"].values()):
            resets.append(f"its error feedback (each rank's own: written by {saved_world} ranks, continuing on "
                          f"{world_size})")
        if not same_rank and any("q" in p for p in mine["pieces"].values()):
            resets.append(f"its warm-start factors (rank {mine['rank']} -> {state.matrix_approximation_rank})")
        for i, piece in mine["pieces"].items():
            kept = {k: t for k, t in piece.items() if (k == "error" and same_world) or (k == "q" and same_rank)}
            if kept:
                self.pending[int(i)] = kept
        return "PowerSGD resets " + " and ".join(resets) if resets else changed


def factors(shapes: list[torch.Size], rank: int) -> list[tuple[int, int, int, int]]:
    """The gradient matrices torch's PowerSGD hook compresses in a bucket of tensors of these shapes, in the order
    its P and Q buffers hold them (grouped by matrix shape, in order of first appearance): (position in the bucket,
    rows n, columns m, rank r). A tensor is the matrix view(shape[0], -1); one compresses where (n + m) r x
    MIN_COMPRESSION_RATE < n m (powerSGD_hook.py: _should_compress)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for position, shape in enumerate(shapes):
        n = shape[0]
        m = shape.numel() // n
        r = min(n, m, rank)
        if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
            groups.setdefault((n, m), []).append(position)
    return [(position, n, m, min(n, m, rank)) for (n, m), positions in groups.items() for position in positions]


def q_slices(shapes: list[torch.Size], rank: int) -> dict[int, slice]:
    """Where each compressed matrix's Q factor (m x r) lies in the bucket's Q buffer, by its position in the bucket."""
    slices, offset = {}, 0
    for position, _, m, r in factors(shapes, rank):
        slices[position] = slice(offset, offset + m * r)
        offset += m * r
    return slices


def p_elements(shapes: list[torch.Size], rank: int) -> int:
    return sum(n * r for _, n, _, r in factors(shapes, rank))


def gradient_hook(hook: GradientHook, bucket):  # no annotations: DDP checks them, and this module's are strings
    """DDP's communication hook for every value of strategy.compression."""
    if hook.clock is not None:
        hook.clock.start()
    hook.traffic.add(0, nbytes(bucket.buffer()))
    return hook.send(hook, bucket)


def counted_allreduce(hook: GradientHook, bucket):
    """DDP's own all-reduce (divide by the world, then sum, as torch's allreduce_hook), of whatever the bucket holds
    now (a wrapper may have cast it), counted."""
    grads = bucket.buffer()
    hook.traffic.add(nbytes(grads), 0)
    grads.div_(dist.get_world_size())
    return dist.all_reduce(grads, async_op=True).get_future().then(lambda fut: fut.value()[0])


def powersgd_allreduce(hook: GradientHook, bucket):
    """torch's PowerSGD hook, its state following the parameters; before its start, the plain all-reduce it would
    make itself, counted."""
    state = hook.powersgd
    hook.follow_layout(bucket)
    if state.iter < state.start_powerSGD_iter:
        future = counted_allreduce(hook, bucket)
        state.maybe_increase_iter(bucket)
        return future
    if hook.in_flight is not None and dist.get_backend() == "gloo":
        # torch's hook makes its second and third all-reduce (P, then Q) from the callbacks of the first, which gloo
        # runs on its own threads: with two buckets in flight each rank could order their collectives its own way
        # (gloo: "Received data size doesn't match expected size"). One bucket's chain ends before the next starts.
        hook.in_flight.wait()
    before = state.total_numel_after_compression
    b = bucket.index()
    future = hook.in_flight = powerSGD_hook(state, bucket).then(lambda fut: recover(state, b, fut.value()))
    hook.traffic.add((state.total_numel_after_compression - before) * bucket.buffer().element_size(), 0)
    return future


def recover(state: PowerSGDState, b: int, reduced: torch.Tensor) -> torch.Tensor:
    """After torch's hook reduced bucket b: state a non-finite gradient made non-finite is let go, so that the next
    step starts clean (torch's hook adds the error feedback to every later gradient and continues from Q: one inf,
    under fp16 a routine GradScaler overflow, made every later step NaN). This rank's error feedback is zeroed. Q was
    all-reduced, so every rank finds it non-finite at once and drops P and Q together; torch then draws fresh ones
    from state.rng, whose draws are the same on every rank. The error is zeroed on the device (no sync); Q's check
    waits for the device once per bucket (torch's hook has just synchronized it on CUDA anyway)."""
    error = state.error_dict.get(b)
    if error is not None:  # a non-finite gradient of a tensor left whole leaves Q finite: its own check
        error.masked_fill_(~torch.isfinite(error).all(), 0)
    q = state.q_memory_dict.get(b)
    if q is not None and not bool(torch.isfinite(q).all()):
        state.p_memory_dict.pop(b, None)
        state.q_memory_dict.pop(b, None)
    return reduced
