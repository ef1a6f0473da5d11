"""The mesh's own wait clock (framework/strategies/mesh/comm_clock.py) on gloo ranks: a micro-batch run as the loop
runs it (under the engine's gradient_sync) times the collectives of tensor parallel and of FSDP2. Rank 1 starts its
micro-batch LATE seconds after rank 0, so rank 0 blocks in the first collective until rank 1 gets there: its wait is
about that (less what rank 0 computes before it, or loses to a loaded core after the barrier: seen 27 ms short of
0.2 s under load, hence half of LATE); rank 1 finds rank 0 already there."""
import time

import pytest
import torch

LATE = 0.4


def _micro_batch_wait(rank: int, world: int, overrides: tuple) -> float:
    from framework.models.gpt import GPT
    from framework.strategies.mesh.dims import MeshGroup
    from framework.training.engine import Weighting, forward_backward, gradient_sync
    from framework.training.instrument import wait_clock
    from framework.training.losses import SequenceCrossEntropy
    from framework.training.step import Supervised
    from support.driver import strategy_for

    strategy = strategy_for(*overrides, "trainer.accelerator=cpu", "trainer.batch_size=8")
    group = MeshGroup(rank, rank, world, torch.device("cpu")).on_mesh(strategy.dims)
    torch.manual_seed(0)
    wrapped = strategy.parallelize(GPT((8,), 11, n_layer=2, n_head=2, n_embd=8),
                                   lambda params, names=None: torch.optim.SGD(params, lr=0.1), group)
    clock = wait_clock(wrapped, group)
    tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(1))
    group.barrier()
    clock.reset()
    if rank == 1:
        time.sleep(LATE)
    with gradient_sync(wrapped, on=True):
        forward_backward(wrapped, Supervised(), (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()),
                         SequenceCrossEntropy(), Weighting(k=1))
    return clock.read()


@pytest.mark.parametrize("overrides", [("strategy=tp",), ("strategy=fsdp",)], ids=["tp", "fsdp"])
def test_the_mesh_times_its_collectives_as_waits(world2, overrides):
    """Before the clock, tensor parallel and FSDP2 had none (wait_clock was None): time/wait_ms was not reported and
    scaling.md said "strategy=tp does not measure its waits"."""
    waits = world2.run(_micro_batch_wait, overrides)
    assert waits[0] >= LATE / 2, f"rank 0 waited {waits[0]:.3f} s for a rank {LATE} s late"
    assert waits[1] < waits[0], waits
