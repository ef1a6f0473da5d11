"""trainer.async_checkpoint on two gloo ranks (framework/training/async_save.py, through the loop's Checkpointer): the
hazard staging exists for. The checkpoint of step 1 is saved behind the loop; its write is held where it starts to
read what it writes (the single file's serialization, DCP's storage writer) while both ranks train step 2, which
changes the parameters and the optimizer's momentum in place; only then is the write let go. What is read back must
be step 1's state exactly, for ddp's single file and fsdp's DCP shards."""
import threading

import pytest
import torch

CPU = torch.device("cpu")


def _held(strategy: str, monkeypatch_like: list):
    """The write of a checkpoint held until the returned event is set: ddp's save_checkpoint (it serializes the state
    first), DCP's FileSystemWriter.write_data (on DCP's own thread). Undone by calling each of monkeypatch_like."""
    release = threading.Event()
    if strategy == "ddp":
        import framework.training.checkpointing as owner
        name = "save_checkpoint"
    else:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter as owner
        name = "write_data"
    real = getattr(owner, name)

    def held(*args, **kwargs):
        assert release.wait(60), "the test never let the write go"
        return real(*args, **kwargs)
    setattr(owner, name, held)
    monkeypatch_like.append(lambda: setattr(owner, name, real))
    return release


def _step(wrapped, rank: int) -> None:
    """One training step of this rank's batch: SGD with momentum changes parameters and momentum in place."""
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))
    wrapped.model(x).square().mean().backward()
    wrapped.optimizer.step()
    wrapped.optimizer.zero_grad()


def _whole(wrapped) -> dict[str, torch.Tensor]:
    """Every parameter and its momentum, whole (a sharded one gathered), cloned: what the model holds now."""
    whole = {}
    for name, p in wrapped.model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        momentum = wrapped.optimizer.state[p]["momentum_buffer"]
        whole[name] = full.detach().clone()
        whole[f"{name}.momentum"] = (momentum.full_tensor() if hasattr(momentum, "full_tensor") else momentum).clone()
    return whole


def _saved_behind_while_training_goes_on(rank: int, world: int, strategy: str, run_dir: str):
    from pathlib import Path

    from framework.checkpoints.position import Position
    from framework.checkpoints.store import find_checkpoint
    from framework.config.trainer import TrainerConfig
    from framework.strategies.mesh.dims import MeshGroup
    from framework.training.checkpointing import Checkpointer
    from support.driver import strategy_for

    torch.manual_seed(0)
    built = strategy_for(f"strategy={strategy}", "trainer.accelerator=cpu")
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    group = MeshGroup(rank, rank, world, CPU).on_mesh(built.dims)
    wrapped = built.parallelize(model, lambda params, **_: torch.optim.SGD(params, lr=0.1, momentum=0.9), group)
    options = TrainerConfig(checkpoint_every_n_steps=1, keep_checkpoints=2, batch_size=8, async_checkpoint=True)
    checkpointer = Checkpointer(group, Path(run_dir), options, {}, lambda line: None)
    undo = []
    try:
        _step(wrapped, rank)  # step 1: the momentum buffers exist
        at_step_1 = _whole(wrapped)
        release = _held(strategy, undo)
        assert checkpointer.save(wrapped, Position(1, 0, 8, 8), {}, {}) is None, "written behind the loop"
        _step(wrapped, rank)  # step 2, in place, while step 1's write waits
        at_step_2 = _whole(wrapped)
        release.set()
        checkpointer.finish()
    finally:
        for undo_one in undo:
            undo_one()
    assert [step for step, _ in checkpointer.committed()] == [1]
    checkpoint = find_checkpoint(Path(run_dir) / "checkpoints", warn=print)
    checkpointer.resume(checkpoint, wrapped)  # step 2's state replaced by what the checkpoint holds
    read_back = _whole(wrapped)
    changed = [name for name in sorted(at_step_1) if not torch.equal(at_step_1[name], at_step_2[name])]
    differ = [name for name in sorted(at_step_1) if not torch.equal(read_back[name], at_step_1[name])]
    return checkpoint.path.name, changed, differ, sorted(at_step_1)


@pytest.mark.parametrize("strategy,written", [("ddp", "step-00000001.pt"), ("fsdp", "step-00000001")])
def test_a_checkpoint_written_behind_the_loop_holds_its_steps_state_while_the_next_step_changes_it_in_place(
        world2, tmp_path, strategy, written):
    answers = world2.run(_saved_behind_while_training_goes_on, strategy, str(tmp_path))
    for rank, (name, changed, differ, names) in enumerate(answers):
        assert name == written, f"rank {rank}"
        assert changed == names, f"rank {rank}: step 2 left {sorted(set(names) - set(changed))} as they were"
        assert differ == [], f"rank {rank}: the checkpoint of step 1 holds step 2's {differ}"
