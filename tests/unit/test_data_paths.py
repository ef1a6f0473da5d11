"""The in-memory input path and the DataLoader path give the same batches, sharded like DistributedSampler."""
import itertools

import torch
from torch.utils.data import DistributedSampler, TensorDataset

from framework.data.augment import RandomCropFlip
from framework.data.builtin import Normalization
from framework.data.loaders import BatchPipeline, DataLoaderLoader, InMemoryLoader, eval_batches, shard_indices
from framework.data.source import DataShare
from support.marks import needs_gpu


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


CPU = torch.device("cpu")


def _pixels(n=100, shape=(1, 8, 8)):
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, 256, (n, *shape), generator=g, dtype=torch.uint8), torch.randint(0, 3, (n,), generator=g)


def test_in_memory_and_dataloader_paths_yield_identical_batches():
    x, y = _pixels()
    for augment in (None, RandomCropFlip(padding=2)):
        pipeline = BatchPipeline(Normalization(1 / 255, (0.5,), (0.25,)), (1, 8, 8), CPU, augment=augment)
        _same_batches(x, y, pipeline)


def _same_batches(x, y, pipeline):
    for rank in (0, 1):
        fast = InMemoryLoader(x, y, pipeline, DataShare(rank, 2, CPU, 8), seed=5)
        slow = DataLoaderLoader(TensorDataset(x, y), pipeline, DataShare(rank, 2, CPU, 8), seed=5)
        for epoch in (0, 1):
            fast.set_epoch(epoch)
            slow.set_epoch(epoch)
            pairs = list(zip(fast, slow, strict=True))
            assert len(pairs) == 50 // 8
            for (xa, ya), (xb, yb) in pairs:
                assert torch.equal(ya, yb) and torch.equal(xa, xb)


def _epoch_batches(loader, epoch):
    loader.set_epoch(epoch)
    return [xb for xb, _ in loader]


def test_augmentation_is_repeatable_and_differs_per_rank_and_epoch_and_on_resume_continues_exactly():
    x, y = _pixels(64, (3, 8, 8))
    pipeline = BatchPipeline(Normalization(1 / 255, (0.5,) * 3, (0.25,) * 3), (3, 8, 8), CPU,
                             augment=RandomCropFlip(padding=2))
    plain = BatchPipeline(Normalization(1 / 255, (0.5,) * 3, (0.25,) * 3), (3, 8, 8), CPU)
    loader = lambda rank, p=pipeline: InMemoryLoader(x, y, p, DataShare(rank, 2, CPU, 8), seed=3)  # noqa: E731
    first, again = _epoch_batches(loader(0), 0), _epoch_batches(loader(0), 0)
    assert all(torch.equal(a, b) for a, b in zip(first, again)), "same seed, same crops"
    unaugmented = _epoch_batches(loader(0, plain), 0)
    assert not all(torch.equal(a, b) for a, b in zip(first, unaugmented)), "augmentation changed the batches"
    assert all(a.shape == b.shape for a, b in zip(first, unaugmented))
    assert not all(torch.equal(a, b) for a, b in zip(first, _epoch_batches(loader(0), 1))), "differs per epoch"
    # rank 1 gets other samples anyway; the same samples under rank 1's generator must crop differently
    shifted = InMemoryLoader(x, y, pipeline, DataShare(1, 2, CPU, 8), seed=3)
    shifted.set_epoch(0)
    resumed = list(shifted.iterate(2))
    assert len(resumed) == len(_epoch_batches(loader(1), 0)) - 2
    assert all(torch.equal(a, b) for (a, _), b in zip(resumed, _epoch_batches(loader(1), 0)[2:])), "resume repeats"


def test_a_split_read_by_index_gives_an_epochs_steps_from_the_step_a_run_resumes_at_counted_in_samples():
    """The StepSource of the map-style loaders (framework/data/source.py): grad_accum micro-batches a step, the
    epoch's last step marked, the epoch's samples over every rank counted in global batches (the position a
    checkpoint records), and nothing after the last step."""
    x, y = _pixels()
    pipeline = BatchPipeline(Normalization(1 / 255, (0.5,), (0.25,)), (1, 8, 8), CPU)
    for loader in (InMemoryLoader(x, y, pipeline, DataShare(1, 2, CPU, 8, grad_accum=2), seed=5),
                   DataLoaderLoader(TensorDataset(x, y), pipeline, DataShare(1, 2, CPU, 8, grad_accum=2), seed=5)):
        assert loader.steps_per_epoch == 3  # 50 samples of rank 1's shard: 6 micro-batches of 8
        whole = _epoch_batches(loader, 1)
        shares = loader.shares(1, 1)  # epoch 1, its first step done
        assert loader.state().samples == 32
        taken = []
        for share in shares:
            taken += [xb for xb, _ in itertools.islice(share.batches, share.real)]
            assert (share.real, share.samples, share.scale) == (2, 32, None)
            assert share.last == (loader.state().samples == 96)
        assert len(taken) == 4 and all(torch.equal(a, b) for a, b in zip(taken, whole[2:]))
        assert loader.state().samples == 96 and loader.state().records is None


def test_generators_differ_per_rank_for_the_same_batch():
    from framework.data.augment import batch_generator

    draws = [torch.rand(4, generator=batch_generator(CPU, 3, 0, rank, 0)) for rank in (0, 1)]
    assert not torch.equal(*draws)


def test_random_crop_moves_pixels_within_the_padding_and_flip_mirrors():
    image = torch.arange(16.0).view(1, 1, 4, 4)
    crop = RandomCropFlip(padding=1, flip=False, pad_mode="constant")
    g = torch.Generator().manual_seed(0)
    outs = [crop(image, g) for _ in range(20)]
    assert any(not torch.equal(o, image) for o in outs)
    for o in outs:  # every output is the image shifted by at most one pixel, zeros brought in
        assert any(torch.equal(o, torch.roll(torch.nn.functional.pad(image, (1, 1, 1, 1)), (dy, dx), (2, 3))[..., 1:5, 1:5])
                   for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    flip = RandomCropFlip(padding=0, flip=True)
    flipped = [flip(image, g) for _ in range(20)]
    assert all(torch.equal(f, image) or torch.equal(f, image.flip(3)) for f in flipped)
    assert any(torch.equal(f, image.flip(3)) for f in flipped)


def test_evaluation_batches_cover_the_test_split_once_and_are_never_augmented():
    x, y = _pixels(50, (3, 8, 8))
    pipeline = BatchPipeline(Normalization(1 / 255, (0.5,) * 3, (0.25,) * 3), (3, 8, 8), CPU,
                             augment=RandomCropFlip(padding=2))
    for dataset in (TensorDataset(x, y), _NoTensors(x, y)):  # the in-memory and the DataLoader evaluation paths
        seen = []
        counts = []
        for rank in (0, 1):
            batches = list(eval_batches(dataset, DataShare(rank, 2, CPU, 8), pipeline))
            counts.append(len(batches))
            seen += [(xb, yb) for xb, yb in batches]
        assert counts[0] == counts[1], "every rank runs the same number of evaluation batches"
        xs = torch.cat([xb for xb, _ in seen])
        assert len(xs) == 50
        expected = torch.cat([pipeline(x[r::2]) for r in (0, 1)])  # normalized, no augmentation
        assert torch.allclose(xs, expected)


class _NoTensors(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


@needs_gpu
def test_a_split_kept_in_cpu_memory_gives_the_gpu_the_same_batches():
    """dataset.in_memory keeps a split that would take over a quarter of the GPU's free memory in CPU memory
    (framework/data/loaders.py: split_home): each batch is gathered there and copied over, the same batches."""
    x, y = _pixels()
    gpu = torch.device("cuda", torch.cuda.current_device())
    pipeline = BatchPipeline(Normalization(1 / 255, (0.5,), (0.25,)), (1, 8, 8), gpu,
                             augment=RandomCropFlip(padding=2))
    on_gpu = InMemoryLoader(x, y, pipeline, DataShare(1, 2, gpu, 8), seed=5)
    in_cpu_memory = InMemoryLoader(x, y, pipeline, DataShare(1, 2, gpu, 8), seed=5, home=CPU)
    assert on_gpu.x.device == gpu and in_cpu_memory.x.device == CPU
    for (xa, ya), (xb, yb) in zip(on_gpu, in_cpu_memory, strict=True):
        assert xb.device == yb.device == gpu and torch.equal(xa, xb) and torch.equal(ya, yb)
