"""Streaming data: a split that is a torch IterableDataset (or a HuggingFace `datasets.IterableDataset`), read in
order, never indexed.

Sharding. Unless the dataset shards itself, the framework deals the stream out in blocks of one micro-batch: from
the epoch's start position P on, block i holds positions [P + i*m, P + (i+1)*m), and rank r's t-th micro-batch is
block t*W + r (W ranks); DataLoader worker j of a rank reads the rank's micro-batches t = j, j + n, j + 2n, ... (n
workers), each reading the stream and skipping the blocks of the others (the cost of sharding a stream nobody can
index: every reader reads it whole). A step takes blocks [s*k*W, (s+1)*k*W) of all ranks together, so after any step
the samples trained are exactly the stream's first `samples_in_epoch`, whatever W, n and m were: a resumed run on
another world size or batch starts the epoch's rest at that position (DistributedSampler's idea, for streams).

A dataset that shards itself (`shards_itself = True`: it reads torch.distributed's rank and
torch.utils.data.get_worker_info() and yields only that reader's samples; HuggingFace's IterableDataset, which the
framework splits over ranks with `split_dataset_by_node` and which splits itself over workers) is read as it comes: a
rank takes its workers' micro-batches in turn.

Uneven shares. Ranks may run out at different steps. Before each step the ranks agree (one all-reduce) on the step's
samples and whether any rank has more; a rank out of data runs the step's forward and backward on a repeat of its last
batch with weight 0 (the engines' collectives need every rank), every real sample's loss is weighted W / (the step's
samples), so the gradient is the mean over the samples the step really had, and the epoch ends for every rank
together when no rank has more (its line says the samples it had; an epoch without any stops the run). Evaluation
agrees alike, batch by batch.

Resume. A dataset with state_dict()/load_state_dict() (torchdata's Stateful protocol) is given its own state back:
each micro-batch comes with the dataset's state after its last sample; for a framework-sharded stream the state
nearest the position the epoch continues at is loaded and the rest read past; for one that shards itself, each rank's
(and DataLoader worker's) own. Any other dataset is fast-forwarded: its readers read the samples it had given again
and skip them (the cost: re-reading that much of the stream, once per reader). A stream that shards itself resumes
only on the world size and trainer.num_workers that saved it (the driver refuses another world size)."""
from __future__ import annotations

import copy
import itertools
import multiprocessing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from framework.checkpoints.position import Position
from framework.common.errors import TrainingStopped
from framework.data.batches import batch_size, to_device
from framework.data.collate import DEFAULT, Collate
from framework.data.source import DataShare, EpochState, Filler, StepShare

SHARDS_ITSELF = "shards_itself"  # the attribute a dataset sets to say it yields only its reader's share
END = "end"  # what a reader yields once its share is over


def is_hf_iterable(dataset) -> bool:
    """A HuggingFace datasets.IterableDataset (known by its type, so `datasets` is never imported for the check)."""
    return type(dataset).__module__.startswith("datasets.") and hasattr(dataset, "n_shards")


def is_stream(dataset) -> bool:
    """A split read in order (an IterableDataset), not by index."""
    return isinstance(dataset, IterableDataset) or is_hf_iterable(dataset)


def shards_itself(dataset) -> bool:
    """A stream that yields only its reader's samples: its position is per rank and DataLoader worker."""
    return is_stream(dataset) and (bool(getattr(dataset, SHARDS_ITSELF, False)) or is_hf_iterable(dataset))


def split_length(dataset) -> int | None:
    """A split's samples; None for a stream, whose length is unknown until it ends."""
    return None if is_stream(dataset) else len(dataset)


def is_stateful(dataset) -> bool:
    return callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))


class LimitedStream(IterableDataset):
    """A stream's first `limit` samples (dataset.max_<split>_samples; a stream that shards itself: each reader's
    first `limit`); its state is the source's, and a Reader counts the limit from the stream's start."""

    def __init__(self, source, limit: int):
        self.source, self.limit = source, limit

    def __iter__(self):
        return itertools.islice(iter(self.source), self.limit)

    def __getattr__(self, name: str):  # state_dict, set_epoch, shards_itself, in_shape, ...
        if name in ("source", "limit"):
            raise AttributeError(name)
        return getattr(self.source, name)


def for_rank(dataset, rank: int, world: int):
    """What rank `rank` reads: HuggingFace's IterableDataset split over the ranks by its own split_dataset_by_node
    (whole shards per rank where their count divides evenly); any other dataset as it is."""
    source = dataset.source if isinstance(dataset, LimitedStream) else dataset
    if not is_hf_iterable(source) or world == 1:
        return dataset
    from datasets.distributed import split_dataset_by_node  # optional: the hf extra, present when the data is HF's

    split = split_dataset_by_node(source, rank=rank, world_size=world)
    return LimitedStream(split, dataset.limit) if isinstance(dataset, LimitedStream) else split


def snapshot(dataset):
    """The dataset's state now (a copy: the dataset goes on changing its own), or None when it keeps none."""
    return copy.deepcopy(dataset.state_dict()) if is_stateful(dataset) else None


@dataclass
class ReaderStart:
    """Where one reader starts: after `items` samples it had read (fast-forward), or from `state` (the dataset's own,
    taken after those `items`)."""

    items: int = 0
    state: Any = None


@dataclass
class Plan:
    """What each reader of a rank needs, picklable (it travels to the DataLoader's workers)."""

    rank: int
    world: int
    micro_batch: int
    workers: int
    self_sharded: bool
    offset: int = 0  # framework sharding: the stream position this epoch continues at
    first_worker: int = 0  # self-sharded: the worker whose micro-batch comes next
    limit: int | None = None  # the stream's last position read (dataset.max_<split>_samples)
    starts: list = field(default_factory=list)  # a ReaderStart per worker (self-sharded), or one for all (framework)


def _as_is(item):
    return item


class Reader(IterableDataset):
    """Runs in each DataLoader worker (or in the trainer's process with trainer.num_workers=0): yields
    (worker, micro-batch, items read, state after it), then (worker, END, items, state) when its share is over."""

    def __init__(self, dataset, plan: Plan, collate: Callable):
        if isinstance(dataset, LimitedStream):
            plan.limit, dataset = dataset.limit, dataset.source
        self.dataset, self.plan, self.collate = dataset, plan, collate

    def __iter__(self):
        info = get_worker_info()
        worker = info.id if info is not None else 0
        start = self.plan.starts[worker if self.plan.self_sharded else 0] if self.plan.starts else ReaderStart()
        if start.state is not None:
            self.dataset.load_state_dict(start.state)
        source = iter(self.dataset)
        if start.state is None and start.items:
            for _ in itertools.islice(source, start.items):  # fast-forward: read the samples given before, again
                pass
        blocks = self._own_samples if self.plan.self_sharded else self._dealt_samples
        for batch, items in blocks(source, start.items, worker):
            yield worker, self.collate(batch), items, snapshot(self.dataset)
        yield worker, END, 0, None

    def _own_samples(self, source: Iterator, items: int, worker: int):
        """A self-sharded dataset's samples, m at a time."""
        limit = self.plan.limit
        while True:
            batch = list(itertools.islice(source, min(self.plan.micro_batch, limit - items) if limit else
                                          self.plan.micro_batch))
            if not batch:
                return
            items += len(batch)
            yield batch, items
            if len(batch) < self.plan.micro_batch:
                return

    def _dealt_samples(self, source: Iterator, position: int, worker: int):
        """This worker's blocks of this rank's share (see the module's docstring), skipping the rest."""
        p, m = self.plan, self.plan.micro_batch
        for t in itertools.count(worker, p.workers):
            low = p.offset + (t * p.world + p.rank) * m
            for _ in itertools.islice(source, max(0, low - position)):
                pass
            position = max(position, low)
            batch = list(itertools.islice(source, max(0, min(m, p.limit - low)) if p.limit else m))
            position += len(batch)
            if not batch:
                return
            yield batch, position
            if len(batch) < m:
                return


class StreamLoader:
    """A rank's micro-batches of a streaming training split, in steps the ranks agree on (see the module's docstring):
    a StepSource (framework/data/source.py) of unknown length. `preparation`: set_epoch(e) and prepared(batch,
    index), the on-device steps (framework/data/loaders.py); `filler`: a batch of the split's kind (on the CPU) a rank
    runs with weight 0 when it had none at all this epoch; `say`: where the epoch's line goes."""

    steps_per_epoch = None

    def __init__(self, dataset, preparation, share: DataShare, collate: Collate = DEFAULT, filler=None, say=print):
        self.dataset = for_rank(dataset, share.rank, share.world)
        self.self_sharded = shards_itself(dataset)
        self.preparation, self.share, self.collate, self.filler, self.say = preparation, share, collate, filler, say
        self.epoch = 0
        self.resume_from: dict | None = None  # this epoch's start, from a checkpoint (restore())
        self.consumed: dict = {}  # what was trained of this epoch: the resume record (state())
        self.samples = 0  # this epoch's samples trained over every rank, the resumed ones included

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if self.preparation is not None:
            self.preparation.set_epoch(epoch)
        if callable(getattr(self.dataset, "set_epoch", None)):  # a stream that reshuffles per epoch
            self.dataset.set_epoch(epoch)

    def restore(self, position: Position) -> None:
        """The epoch a checkpoint stopped in continues after its first `samples_in_epoch` samples: `streams` holds
        every rank's record (state()); the next shares() says how."""
        self.resume_from = {"offset": position.samples_in_epoch, "records": position.streams or []}

    def _resume_line(self) -> str:
        resume = self.resume_from
        if not resume or not resume["offset"]:
            return ""
        if self.self_sharded:
            how = "each rank's own state" if any(s and s.get("state") is not None for r in resume["records"]
                                                 for s in r.get("readers", [])) else "count (each reader re-reads "\
                "the samples it had given)"
        else:
            how = ("the dataset's state nearest it" if is_stateful(self.dataset) else
                   f"count (each of {self.share.world * max(1, self.share.num_workers)} readers re-reads those samples)")
        return f"the stream continues after {resume['offset']} samples of its epoch, by {how}"

    def _plan(self) -> Plan:
        share = self.share
        workers = max(1, share.num_workers)
        plan = Plan(share.rank, share.world, share.micro_batch, workers, self.self_sharded)
        resume, self.resume_from = self.resume_from, None
        if not resume or not resume["offset"]:
            return plan
        records = resume["records"]
        if self.self_sharded:
            mine = records[share.rank] if share.rank < len(records) else None
            if mine is None or len(records) != share.world or len(mine["readers"]) != workers:
                raise RuntimeError(
                    f"dataset.train shards itself, and its saved stream position is per rank and DataLoader worker "
                    f"({len(records)} rank(s) x {len(mine['readers']) if mine else '?'} worker(s)); resume it with "
                    f"{len(records)} worker process(es) and trainer.num_workers={max(1, len(mine['readers'])) if mine else '?'}")
            plan.starts = [ReaderStart(r["items"], r["state"]) for r in mine["readers"]]
            plan.first_worker = mine["next"]
            return plan
        plan.offset = resume["offset"]
        saved = [(r["position"], r["state"]) for r in records if r and r.get("state") is not None
                 and r["position"] <= plan.offset]
        if saved and is_stateful(self.dataset):
            position, state = max(saved, key=lambda s: s[0])
            plan.starts = [ReaderStart(position, state)]
        else:
            plan.starts = [ReaderStart(0, None)]
        return plan

    def _batches(self, plan: Plan):
        """(worker, batch, items, state) in this rank's order: its workers in turn (from worker `next` for a
        self-sharded stream resumed), a worker that is done left out; framework-sharded, the first done ends it."""
        reader = Reader(self.dataset, plan, self.collate.fn)
        # forked from this process (not from the launcher's forkserver template): a dataset that shards itself
        # reads its rank from torch.distributed, which a forked reader has as this process had it
        workers = self.share.num_workers
        context = "fork" if workers and "fork" in multiprocessing.get_all_start_methods() else None
        loader = DataLoader(reader, batch_size=None, num_workers=workers, collate_fn=_as_is,
                            pin_memory=self.share.device.type == "cuda", multiprocessing_context=context)
        workers = plan.workers
        pending: dict[int, list] = {w: [] for w in range(workers)}
        done: set[int] = set()
        turn = plan.first_worker
        items = iter(loader)
        try:
            while len(done) < workers:
                if turn in done:
                    turn = (turn + 1) % workers
                    continue
                while not pending[turn]:
                    worker, batch, count, state = next(items)
                    pending[worker].append((batch, count, state))
                batch, count, state = pending[turn].pop(0)
                if isinstance(batch, str) and batch == END:
                    done.add(turn)
                    if not plan.self_sharded:
                        return
                    continue
                yield turn, batch, count, state
                turn = (turn + 1) % workers
        finally:
            del items  # stops the workers of a share left early (max_steps, a stop)

    @staticmethod
    def _records(plan: Plan) -> dict:
        """The record of an epoch (part) nothing of which is trained yet: where its readers start."""
        starts = plan.starts or [ReaderStart()] * (plan.workers if plan.self_sharded else 1)
        return {"next": plan.first_worker, "position": starts[0].items, "state": starts[0].state,
                "readers": [{"items": s.items, "state": s.state} for s in starts] if plan.self_sharded else []}

    def shares(self, epoch: int, start: int = 0) -> Iterator[StepShare]:
        """Epoch `epoch`'s steps, k micro-batches each (fillers where this rank has no more), until no rank has more;
        a restored epoch from where restore() said (`start` is 0: a stream has no steps per epoch to count it in)."""
        self.set_epoch(epoch)
        line = self._resume_line()
        if line:
            self.say(line)
        return self._steps()

    def _steps(self) -> Iterator[StepShare]:
        self.samples = self.resume_from["offset"] if self.resume_from else 0
        plan = self._plan()
        self.consumed = self._records(plan)
        batches = self._batches(plan)
        grad_accum, share = self.share.grad_accum, self.share
        ahead = next(batches, None)
        last_batch = None
        index = 0
        while True:
            taken = []
            while ahead is not None and len(taken) < grad_accum:
                taken.append(ahead)
                ahead = next(batches, None)
            here = sum(batch_size(b) for _, b, _, _ in taken)
            total, more = (int(v) for v in share.peers.agree(
                torch.tensor([here, int(ahead is not None)], device=share.device, dtype=torch.int64)).tolist())
            if total == 0:  # resumed at the epoch's end, or a stream with nothing in it
                self._epoch_over()
                return
            micro = []
            for worker, batch, count, state in taken:
                self._consume(worker, count, state, plan)
                micro.append(self._prepared(batch, index))
                index += 1
            if micro:
                last_batch = micro[-1]
            filler = last_batch if last_batch is not None else self._prepared(self.filler, 0)
            micro += [filler] * (grad_accum - len(micro))
            self.samples += total
            yield StepShare(iter(micro), len(taken), total, share.world / total, last=more == 0)
            if more == 0:  # no rank has more: every rank ends here, with no need to agree on it
                self._epoch_over()
                return

    def _epoch_over(self) -> None:
        if self.samples == 0:
            raise TrainingStopped(f"dataset.train yielded no sample in epoch {self.epoch + 1}: an epoch iterates the "
                                  "stream again (its __iter__ must start over each time it is called)")
        self.say(f"epoch {self.epoch + 1}: the stream gave {self.samples} samples")

    def _prepared(self, batch, index: int):
        batch = to_device(batch, self.share.device)
        return self.preparation.prepared(batch, index) if self.preparation is not None else batch

    def _consume(self, worker: int, count: int, state, plan: Plan) -> None:
        c = self.consumed
        if plan.self_sharded:
            c["readers"][worker] = {"items": count, "state": state}
            c["next"] = (worker + 1) % plan.workers
        else:
            c["position"], c["state"] = count, state

    def state(self) -> EpochState:
        """The epoch's samples so far, and every rank's record of it (a collective: every rank calls it)."""
        return EpochState(self.samples, self.share.peers.gather(copy.deepcopy(self.consumed)))


def eval_stream(dataset, prepare: Callable, share: DataShare, collate: Collate, filler):
    """This rank's share of a streaming test split in batches of share.micro_batch (every sample once over the
    ranks), and Fillers while other ranks still have some: every rank runs as many forwards (a sharding engine
    gathers in each)."""
    plan = Plan(share.rank, share.world, share.micro_batch, max(1, share.num_workers), shards_itself(dataset))
    loader = StreamLoader(dataset, None, share, collate, filler)
    batches = loader._batches(plan)
    device, agree = share.device, share.peers.agree
    last = None
    while True:
        item = next(batches, None)
        has = torch.tensor([int(item is not None)], device=device, dtype=torch.int64)
        if int(agree(has).item()) == 0:
            return
        if item is None:
            yield Filler(last if last is not None else prepare(to_device(filler, device)))
            continue
        last = prepare(to_device(item[1], device))
        yield last
