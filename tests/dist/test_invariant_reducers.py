"""The world-size-invariant mode's reducers (framework/training/invariant/) on real gloo ranks: the same K shards'
gradients summed by 1, 2 and 4 ranks give the same bits, for synthetic gradients spread over 2^-20 .. 2^20 and for
LeNet's per-shard gradients computed on each rank (one thread per rank); and the whole step the loop runs
(InvariantStep: each rank its share of the global batch, as the sampler deals it, cut into its micro-shards, dropout
keyed by shard) leaves the same gradient bits and global loss on 1, 2 and 4 ranks. The 4-rank world is the module's;
its 2-rank subgroups ({0, 1} and {2, 3}) and each rank alone are the smaller world sizes. The fixed-point sum's int64
all-reduce is gloo's own."""
import hashlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from framework.models.lenet import LeNet
from framework.strategies.groups import TorchGroup
from framework.training.engine import LocalGroup, ProcessGroup, Wrapped
from framework.training.invariant import FixedPointSum, GatheredTreeSum, InvariantStep, owned_shards
from framework.training.precision import Precision
from framework.training.step import Supervised

SHARDS, BATCH = 8, 64
REDUCERS = {"gathered": GatheredTreeSum, "fixed_point": FixedPointSum}


class _Subgroup(ProcessGroup):
    """A torch.distributed subgroup as the reducers' ProcessGroup (they use all_gather and all_reduce_sum only)."""

    def __init__(self, pg):
        super().__init__(dist.get_rank(pg), 0, dist.get_world_size(pg), torch.device("cpu"))
        self.pg = pg

    def all_gather(self, t):
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t.contiguous(), group=self.pg)
        return torch.stack(out)

    def all_reduce_sum(self, t):
        dist.all_reduce(t, group=self.pg)
        return t

    def gather_objects(self, obj):
        raise NotImplementedError("the reducers do not gather objects")

    def broadcast_object(self, obj):
        raise NotImplementedError("the reducers do not broadcast")

    def barrier(self):
        raise NotImplementedError("the reducers need no barrier")

    def leave(self, wait_for_peers):
        raise NotImplementedError("the module's world outlives the test")


def _synthetic(k: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + k)
    spread = lambda *shape: torch.randn(*shape, generator=g) * 2.0 ** torch.randint(-20, 21, shape, generator=g)
    return [spread(20, 30), spread(30), spread(7)]


def _lenet(k: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = LeNet((1, 28, 28), 10)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
    (F.cross_entropy(model(x[k::SHARDS]), y[k::SHARDS], reduction="sum") / BATCH).backward()
    return [p.grad for p in model.parameters()]


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _sums_at_every_world_size(rank: int, world_size: int, source: str) -> dict:
    """{reducer: {W: digest}} of this rank's sums over W = 4 (every rank), 2 (its pair) and 1 (itself)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair, _ = dist.new_subgroups(group_size=2)
        groups = {4: TorchGroup(rank, rank, world_size, torch.device("cpu")), 2: _Subgroup(pair),
                  1: LocalGroup(torch.device("cpu"))}
        shard_gradient = {"synthetic": _synthetic, "lenet": _lenet}[source]
        out = {}
        for name, reducer in REDUCERS.items():
            out[name] = {}
            for w, group in groups.items():
                owned = [shard_gradient(k) for k in owned_shards(group.rank, w, SHARDS)]
                out[name][w] = _digest(reducer(SHARDS).reduce(owned, group))
        return out
    finally:
        torch.set_num_threads(threads)


def _one_digest_per_reducer(answers: list[dict]) -> dict:
    digests = {name: {d[name][w] for d in answers for w in (1, 2, 4)} for name in REDUCERS}
    assert all(len(found) == 1 for found in digests.values()), digests
    return {name: found.pop() for name, found in digests.items()}


def test_synthetic_shards_sum_to_the_same_bits_on_1_2_and_4_ranks_and_in_this_process(world4):
    digests = _one_digest_per_reducer(world4.run(_sums_at_every_world_size, "synthetic"))
    here = LocalGroup(torch.device("cpu"))
    for name, reducer in REDUCERS.items():
        assert digests[name] == _digest(reducer(SHARDS).reduce([_synthetic(k) for k in range(SHARDS)], here))
    assert digests["gathered"] != digests["fixed_point"]  # two different sums, each the same at every world size


def test_lenets_shard_gradients_computed_on_each_rank_sum_to_the_same_bits_on_1_2_and_4_ranks(world4):
    _one_digest_per_reducer(world4.run(_sums_at_every_world_size, "lenet"))


class _Data:
    step, loss = Supervised(), nn.CrossEntropyLoss(reduction="none")


def _step_at_every_world_size(rank: int, world_size: int) -> dict:
    """{reducer: {W: digest of the gradients and the global loss}} of one InvariantStep of a dropout net, this rank
    training its share of the global batch among W = 4, 2 (its pair) and 1 (itself)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair, _ = dist.new_subgroups(group_size=2)
        groups = {4: TorchGroup(rank, rank, world_size, torch.device("cpu")), 2: _Subgroup(pair),
                  1: LocalGroup(torch.device("cpu"))}
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(BATCH, 1, 28, 28, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
        out = {}
        for name, reducer in REDUCERS.items():
            out[name] = {}
            for w, group in groups.items():
                torch.manual_seed(0)
                model = nn.Sequential(nn.Flatten(), nn.Linear(784, 64), nn.Dropout(0.3), nn.ReLU(), nn.Linear(64, 10))
                wrapped = Wrapped(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                  Precision("fp32", torch.device("cpu")), None, model)
                step = InvariantStep(SHARDS, reducer(SHARDS), group, 42, lambda shard, generator: shard)
                ran = step.run(wrapped, _Data, (x[group.rank::w], y[group.rank::w]), 5, 0)
                out[name][w] = _digest([*(p.grad for p in model.parameters()), ran.global_sum])
        return out
    finally:
        torch.set_num_threads(threads)


def test_the_invariant_step_leaves_the_same_gradient_and_loss_bits_on_1_2_and_4_ranks(world4):
    digests = _one_digest_per_reducer(world4.run(_step_at_every_world_size))
    assert digests["gathered"] != digests["fixed_point"]
