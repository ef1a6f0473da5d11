"""The in-memory input path and the DataLoader path give the same batches, sharded like DistributedSampler."""
import torch
from torch.utils.data import DistributedSampler

from framework.data.loaders import DataLoaderLoader, InMemoryLoader, Normalizer, shard_indices
from framework.data.synthetic import make_synthetic


def test_shards_match_distributed_sampler_and_cover_the_data_once():
    n, world = 103, 2
    shards = [shard_indices(n, r, world, epoch=3, seed=7) for r in range(world)]
    for r in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=7, drop_last=True)
        sampler.set_epoch(3)
        assert shards[r] == list(sampler)
    assert len(set(shards[0]) | set(shards[1])) == 2 * (n // world)
    assert shard_indices(n, 0, 1, epoch=4, seed=7) != shard_indices(n, 0, 1, epoch=3, seed=7)


def test_global_batch_is_the_same_set_for_any_world_size():
    """Rank r's i-th micro-batch of size B/W, over all ranks, is exactly single's i-th batch of size B."""
    n, batch = 256, 32
    single = shard_indices(n, 0, 1, 0, 1)
    for world in (2, 4):
        shards = [shard_indices(n, r, world, 0, 1) for r in range(world)]
        micro = batch // world
        for i in range(n // batch):
            union = sorted(sum((s[i * micro:(i + 1) * micro] for s in shards), []))
            assert union == sorted(single[i * batch:(i + 1) * batch])


def test_in_memory_and_dataloader_paths_yield_identical_batches():
    splits = make_synthetic([1, 8, 8], 3, 100, 10, 1.0, 0)
    splits.train_x = (splits.train_x.abs() * 40).clamp(0, 255).to(torch.uint8)
    splits.scale = 1 / 255
    cpu = torch.device("cpu")
    norm = Normalizer(splits, cpu)
    for rank in (0, 1):
        fast = InMemoryLoader(splits.train_x, splits.train_y, norm, cpu, 8, rank, 2, seed=5)
        slow = DataLoaderLoader(splits.train_x, splits.train_y, norm, cpu, 8, rank, 2, seed=5, num_workers=0)
        for epoch in (0, 1):
            fast.set_epoch(epoch)
            slow.set_epoch(epoch)
            pairs = list(zip(fast, slow, strict=True))
            assert len(pairs) == 50 // 8
            for (xa, ya), (xb, yb) in pairs:
                assert torch.equal(ya, yb) and torch.equal(xa, xb)
