"""`trainer.deal_as_ranks=N`: one process reads its training split as N data-parallel ranks would, in turn.

Micro-batch i of an epoch is rank i mod N's micro-batch i div N, taken from that rank's own loader (its shard of the
epoch's permutation, prepared and augmented as that rank prepares it). With trainer.grad_accum = N x k, one optimizer
step accumulates exactly the N x k micro-batches that N ranks accumulating k each train in their step: the same
samples, shapes and kernels per micro-batch; only the order in which their gradients are summed differs (one after
the other here, an all-reduce there). verify.py trains this as its rounding floor (docs/verify.md).

A stream the framework deals (framework/data/streams.py) is read this way by one process already: its block i is
rank i mod N's micro-batch i div N for every N, so it needs no second loader."""
from __future__ import annotations

from dataclasses import replace

from framework.data.loaders import MapSource
from framework.data.source import DataShare


class RanksInTurn(MapSource):
    """The training split of one process that plays N ranks' data, as a StepSource: `loaders[r]` is rank r's (world
    size N, each its own share); a step is grad_accum = N x k of their micro-batches in turn."""

    def __init__(self, loaders: list, share: DataShare):
        n = len(loaders)
        super().__init__(loaders[0].pipeline, replace(share, rank=0, world=1), 0)
        self.loaders = loaders
        assert all(loader.share.world == n for loader in loaders) and share.grad_accum % n == 0

    def __len__(self) -> int:
        return len(self.loaders) * len(self.loaders[0])  # DistributedSampler(drop_last) gives every rank as many

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def iterate(self, start: int):
        """This epoch's micro-batches from number `start` on (a resumed epoch skips the ones done)."""
        n = len(self.loaders)
        each = [loader.iterate(start // n + (1 if rank < start % n else 0)) for rank, loader in enumerate(self.loaders)]
        for i in range(start, len(self)):
            yield next(each[i % n])
