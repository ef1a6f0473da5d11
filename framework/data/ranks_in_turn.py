"""`trainer.deal_as_ranks=N`: one process reads its training split as N data-parallel ranks would, in turn.

Micro-batch i of an epoch is rank i mod N's micro-batch i div N, taken from that rank's own loader (its shard of the
epoch's permutation, prepared and augmented as that rank prepares it). With trainer.grad_accum = N x k, one optimizer
step accumulates exactly the N x k micro-batches that N ranks accumulating k each train in their step: the same
samples, shapes and kernels per micro-batch; only the order in which their gradients are summed differs (one after
the other here, an all-reduce there). verify.py trains this as its rounding floor (docs/verify.md).

A stream the framework deals (framework/data/streams.py) is read this way by one process already: its block i is
rank i mod N's micro-batch i div N for every N, so it needs no second loader."""
from __future__ import annotations


class RanksInTurn:
    """The training loader of one process that plays N ranks' data: `loaders[r]` is rank r's (world size N)."""

    def __init__(self, loaders: list):
        self.loaders = loaders

    def __len__(self) -> int:
        return len(self.loaders) * len(self.loaders[0])  # DistributedSampler(drop_last) gives every rank as many

    def set_epoch(self, epoch: int) -> None:
        for loader in self.loaders:
            loader.set_epoch(epoch)

    def iterate(self, start: int):
        """This epoch's micro-batches from number `start` on (a resumed epoch skips the ones done)."""
        n = len(self.loaders)
        each = [loader.iterate(start // n + (1 if rank < start % n else 0)) for rank, loader in enumerate(self.loaders)]
        for i in range(start, len(self)):
            yield next(each[i % n])
