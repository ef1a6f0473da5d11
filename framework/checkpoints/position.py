"""Where a run stands in its data, recorded so that it survives a new world size, grad_accum or global batch.

Why samples, not batches: sharding follows DistributedSampler (framework/data/loaders.py). Epoch e's permutation
`perm` of the N training samples is seeded by seed + e and does not depend on the world size W; rank r takes
perm[r::W] (cut to a multiple of W) in micro-batches of m = B / (W * k) for the global batch B and grad_accum k.
After s optimizer steps of the epoch, rank r has trained its first s*k*m shard samples, perm[r + W*j] for
j < s*k*m: all ranks together exactly perm[:s*B], whatever W, m and k were. A checkpoint records that as
`samples_in_epoch` = s*B.

A run resumed with W' workers and global batch B' goes on at step s' = samples_in_epoch / B' of the epoch:
each rank skips its first s'*k'*m' = samples_in_epoch / W' shard samples and so takes
perm[samples_in_epoch + r + W'*j]: the rest of the epoch, each sample once, none twice. s' must be whole: with
the same B it always is; after a change of B, samples_in_epoch must be a multiple of B' (or the epoch's last full
batch of B' trained), else the driver refuses the run before it starts.

Steps per epoch are floor(N / B) for every W and k (W divides B, so N mod W <= N mod B and the per-rank cut
never costs a batch). With the same B the step count carries over as saved; with a new B it is re-expressed
as epoch * floor(N / B') + s', the step the new batch would be at (max_steps and the lr schedule count those).

A streaming split (framework/data/streams.py) has no N: `samples_in_epoch` is what its steps really had (the ranks
agree on it each step), `streams` every rank's record of where its readers stand, and a resumed run keeps the saved
step count (there is no floor(N / B') to re-express it by).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Position:
    """`step` optimizer steps done; in epoch `epoch`, the first `samples_in_epoch` samples of its permutation
    trained, by a run of global batch `batch_size`."""

    step: int = 0
    epoch: int = 0
    samples_in_epoch: int = 0
    batch_size: int = 0
    streams: list | None = None  # a streaming split: each rank's record (training state only, not the manifest)

    @classmethod
    def from_saved(cls, saved: dict) -> "Position":
        """A checkpoint's position (its manifest and its training state both carry these four numbers)."""
        return cls(saved["step"], saved["epoch"], saved["samples_in_epoch"], saved["batch_size"],
                   saved.get("streams"))


@dataclass
class ResumePoint:
    step: int
    epoch: int
    steps_in_epoch: int  # steps of this run's batch already done in `epoch`


class PositionDoesNotFit(ValueError):
    """The saved position falls inside a batch of this run's size; the message says where and what fits."""


def resume_point(position: Position, batch_size: int, steps_per_epoch: int | None) -> ResumePoint:
    """Where a run of global batch `batch_size` (floor(N / batch_size) = steps_per_epoch; None for a stream)
    continues."""
    if steps_per_epoch is None:
        return ResumePoint(position.step, position.epoch, 0)
    done, rest = divmod(position.samples_in_epoch, batch_size)
    if done >= steps_per_epoch:  # no full batch of this size is left in the epoch: it is complete
        done, rest = steps_per_epoch, 0
    if rest:
        fits = [b for b in range(1, position.samples_in_epoch + 1) if position.samples_in_epoch % b == 0]
        raise PositionDoesNotFit(
            f"the checkpoint stopped after {position.samples_in_epoch} samples of epoch {position.epoch + 1}, "
            f"which is not a whole number of batches of {batch_size}; use the checkpoint's batch "
            f"{position.batch_size} or another divisor of {position.samples_in_epoch} "
            f"(e.g. {', '.join(map(str, fits[-4:]))})")
    if position.batch_size == batch_size:
        return ResumePoint(position.step, position.epoch, done)
    return ResumePoint(position.epoch * steps_per_epoch + done, position.epoch, done)
