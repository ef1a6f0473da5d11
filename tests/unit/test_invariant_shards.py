"""The world-size-invariant mode's micro-shards in this process (framework/training/invariant/): a rank's micro-batch,
dealt by the framework's own sampler, cut into its shards is exactly those shards of the global batch (the same
samples in the same order) for 1, 2, 4 and 8 ranks; dropout's masks follow the shard's key, whatever was drawn
before and however many threads draw them, and the caller's generator is left where it was."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from framework.data.loaders import shard_indices
from framework.training.invariant import rank_shards, shard_draws

SAMPLES, BATCH, SHARDS = 200, 32, 8
CPU = torch.device("cpu")


def _global_batch(step: int) -> torch.Tensor:
    """The sample ids of one global batch as one process (world 1) is dealt them."""
    return torch.tensor(shard_indices(SAMPLES, 0, 1, epoch=3, seed=5)[step * BATCH:(step + 1) * BATCH])


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_each_ranks_micro_batch_cut_into_its_shards_gives_the_global_batchs_shards(world):
    micro = BATCH // world
    for step in range(SAMPLES // BATCH):
        whole = _global_batch(step)
        found = {}
        for rank in range(world):
            ids = torch.tensor(shard_indices(SAMPLES, rank, world, epoch=3, seed=5)[step * micro:(step + 1) * micro])
            batch = {"x": ids.float().unsqueeze(1), "y": [ids]}  # any nesting
            for k, part in rank_shards(batch, rank, world, SHARDS):
                assert torch.equal(part["x"].squeeze(1).long(), part["y"][0])
                found[k] = part["y"][0]
        assert sorted(found) == list(range(SHARDS))
        for k, ids in found.items():
            assert torch.equal(ids, whole[k::SHARDS]), (world, step, k)


def _masks(threads: int, drawn_before: int, shard: int = 3) -> list[torch.Tensor]:
    torch.set_num_threads(threads)
    torch.rand(drawn_before)
    x, q = torch.ones(8, 4096), torch.ones(8, 4, 64, 32)
    with shard_draws(seed=0, step=7, shard=shard, devices=[CPU]):
        return [nn.Dropout(0.1).train()(x), F.dropout(x, 0.5, training=True),
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.2, is_causal=True)]


def test_a_shards_dropout_masks_follow_its_key_whatever_was_drawn_before_and_at_any_thread_count():
    threads = torch.get_num_threads()
    try:
        reference = _masks(1, 0)
        for other in (_masks(1, 12345), _masks(2, 7)):
            assert all(torch.equal(a, b) for a, b in zip(reference, other))
        assert not any(torch.equal(a, b) for a, b in zip(reference, _masks(1, 0, shard=4)))
    finally:
        torch.set_num_threads(threads)


def test_the_callers_generator_continues_as_if_no_shard_had_drawn():
    torch.manual_seed(5)
    torch.rand(3)
    with shard_draws(seed=0, step=1, shard=0, devices=[CPU]):
        F.dropout(torch.ones(1000), 0.5)
    after = torch.rand(4)
    torch.manual_seed(5)
    torch.rand(3)
    assert torch.equal(after, torch.rand(4))
