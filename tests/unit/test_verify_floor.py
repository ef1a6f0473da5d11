"""verify.py's rounding floor in this process: which run stands for the split's rounding (framework/verify/floor.py),
and that one process with trainer.deal_as_ranks=W trains each step as the W ranks' micro-batches, each prepared as
that rank prepares it (framework/data/ranks_in_turn.py), with its refusals. That the floor run's losses are a
ddp run's: tests/runs/test_verify.py."""
import itertools

import pytest
import torch

from framework.callbacks.switch_off import BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS
from framework.data.augment import RandomCropFlip
from framework.data.builtin import Normalization
from framework.data.loaders import BatchPipeline, InMemoryLoader
from framework.data.ranks_in_turn import RanksInTurn
from framework.data.source import DataShare
from framework.models.lenet import LeNet
from framework.verify.causes import switched_off
from framework.verify.floor import floor_run
from framework.verify.runs import first_steps, one_process
from support.driver import driver_says
from verify_subjects import BatchNormCNN

CPU = torch.device("cpu")


def _rank_loaders(world: int, micro: int):
    """Each rank's training loader over 100 numbered samples, with per-rank augmentation."""
    x = torch.arange(100 * 64, dtype=torch.float32).reshape(100, 1, 8, 8) % 251
    y = torch.arange(100)
    pipeline = BatchPipeline(Normalization(1 / 255, (0.5,), (0.25,)), (1, 8, 8), CPU, augment=RandomCropFlip(2))
    return [InMemoryLoader(x, y, pipeline, DataShare(rank, world, CPU, micro), seed=4) for rank in range(world)]


def _played(world: int, micro: int, k: int = 1):
    """One process playing the `world` ranks' loaders, k micro-batches of each to a step."""
    return RanksInTurn(_rank_loaders(world, micro), DataShare(0, 1, CPU, micro, grad_accum=world * k))


@pytest.mark.parametrize("world", [2, 3])
def test_one_process_dealt_as_ranks_reads_each_ranks_micro_batches_in_turn(world):
    played, ranks = _played(world, 4), _rank_loaders(world, 4)
    for epoch in (0, 1):
        played.set_epoch(epoch)
        for loader in ranks:
            loader.set_epoch(epoch)
        each = [list(loader.iterate(0)) for loader in ranks]
        batches = list(played.iterate(0))
        assert len(batches) == len(played) == world * len(each[0])
        for i, (x, y) in enumerate(batches):
            rank_x, rank_y = each[i % world][i // world]
            assert torch.equal(y, rank_y) and torch.equal(x, rank_x), "the rank's samples, augmented as it does"
        assert [y.tolist() for _, y in played.iterate(5)] == [y.tolist() for _, y in batches[5:]], "a resumed epoch"


def test_a_step_of_the_played_ranks_is_the_ranks_step():
    """With trainer.grad_accum = W x k, one step takes the k micro-batches of each of the W ranks: the samples of
    the step of W ranks accumulating k each."""
    world, k = 2, 3
    played, ranks = _played(world, 4, k), _rank_loaders(world, 4)
    second = next(played.shares(0, 1))  # the loop's second step of epoch 0
    assert second.real == world * k and second.samples == world * k * 4
    step = [y for _, y in itertools.islice(second.batches, second.real)]
    ranks_step = [y for loader in ranks for _, y in list(loader.iterate(0))[k:2 * k]]
    assert sorted(torch.cat(step).tolist()) == sorted(torch.cat(ranks_step).tolist())


def test_the_floor_is_the_ranks_micro_batches_where_they_compute_what_one_process_does():
    lenet = LeNet((1, 28, 28), 10)
    split = floor_run(lenet, 2, 3, [], train=[])
    assert split.name == "single_as_ranks"
    assert split.overrides == ["trainer.deal_as_ranks=2", "trainer.grad_accum=6"]
    assert split.what == "one process training each step as the 2 ranks' micro-batches"
    assert floor_run(lenet, 2, 1, switched_off(TRAINING_MODE_DRAWS), train=[]).name == "single_as_ranks"
    batchnorm = BatchNormCNN((1, 28, 28), 10)
    other = floor_run(batchnorm, 2, 1, [], train=[])
    assert other.name == "single_other_order" and "BatchNorm's batch statistics" in other.what
    assert floor_run(batchnorm, 2, 1, switched_off(BATCHNORM_STATISTICS), train=[]).name == "single_as_ranks"
    assert "not split over data-parallel processes" in floor_run(lenet, 1, 1, [], train=[]).what  # tp, pp alone; dp


def test_the_floors_overrides_compose_and_pass_train_pys_checks(tmp_path):
    user = ["strategy=ddp", "strategy.nproc_per_node=2", "trainer.batch_size=64", "trainer.grad_accum=2"]
    for model in (LeNet((1, 28, 28), 10), BatchNormCNN((1, 28, 28), 10)):
        floor = floor_run(model, 2, 2, [], train=[])
        args = [*one_process([o for o in user if not o.startswith("trainer.grad_accum=")]), *floor.overrides]
        assert driver_says([*args, *first_steps(5)], tmp_path) == "", args


@pytest.mark.parametrize("args, line", [
    (["strategy=ddp", "strategy.nproc_per_node=2", "trainer.deal_as_ranks=2", "trainer.grad_accum=2"],
     "trainer.deal_as_ranks=2 is not allowed with strategy=ddp (2 data-parallel ranks): it makes one process read "
     "the data as N ranks would; use it with one process (strategy=single), or leave it out"),
    (["strategy=single", "trainer.deal_as_ranks=2", "trainer.grad_accum=3", "trainer.batch_size=96"],
     "trainer.deal_as_ranks=2 is not allowed with trainer.grad_accum=3: a step takes a micro-batch of every rank in "
     "turn, so trainer.grad_accum must be a multiple of 2 (2 x the accumulation of each rank)"),
    (["strategy=single", "trainer.deal_as_ranks=0"], "trainer.deal_as_ranks=0 is not allowed: expected an integer >= 1 or null"),
])
def test_deal_as_ranks_is_refused_where_one_process_cannot_play_the_ranks(tmp_path, args, line):
    assert driver_says(args, tmp_path) == line
