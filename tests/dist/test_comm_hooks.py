"""Communication hooks on a persistent gloo world (support/gloo_world.py): the timed all-reduce the per-rank wait
clock registers is DDP's own all-reduce, to the bit."""
import torch
from torch import nn

from framework.models.lenet import LeNet


def _gradients_with_and_without_the_hook(rank: int, world: int) -> bool:
    from framework.telemetry.wait_clock import WaitClock, timed_allreduce

    grads, clock = [], WaitClock(torch.device("cpu"))
    for timed in (False, True):
        torch.manual_seed(0)
        model = LeNet((1, 28, 28), 10)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)  # several buckets
        if timed:
            ddp.register_comm_hook(clock, timed_allreduce)
        g = torch.Generator().manual_seed(rank)
        for _ in range(2):
            ddp.zero_grad(set_to_none=True)
            x, y = torch.randn(8, 1, 28, 28, generator=g), torch.randint(0, 10, (8,), generator=g)
            nn.functional.cross_entropy(ddp(x), y).backward()
            clock.stop()
        grads.append([p.grad.clone() for p in model.parameters()])
    return all(torch.equal(a, b) for a, b in zip(*grads)) and clock.read() > 0


def test_the_timed_all_reduce_gives_bit_identical_gradients_to_ddp_on_four_gloo_ranks(world4):
    assert world4.run(_gradients_with_and_without_the_hook) == [True] * 4
