"""trainer.deterministic=true as real runs (the subject is what the workers and their DataLoader worker processes
draw): the same command twice, with 2 DataLoader workers per rank whose per-sample transform draws random numbers
(tests/support/user_code/jittered_data.py), gives bitwise equal losses at every step and bitwise equal weights and
optimizer state in the last checkpoint, under single and under ddp with 2 gloo workers. In-process (the switch's
flags, refusals, an op without a deterministic kernel, warn): tests/unit/test_determinism.py."""
import pytest

from framework.checkpoints.digest import state_digest
from support.processes import user_code_env
from support.run_files import losses_by_step

JITTERED = [
    "model=custom", "model._target_=torch.nn.Sequential",
    "+model._args_=[{_target_: torch.nn.Flatten}, {_target_: torch.nn.Linear, in_features: 64, out_features: 4}]",
    "dataset=custom", "dataset.train={_target_: jittered_data.Jittered, size: 512}",
    "dataset.test={_target_: jittered_data.Jittered, size: 128, seed: 1}", "dataset.in_memory=false",
    "trainer.num_workers=2", "trainer.epochs=2", "trainer.batch_size=64", "trainer.log_every_n_steps=1",
    "trainer.deterministic=true",
]
STRATEGIES = {"single": ["strategy=single"], "ddp": ["strategy=ddp", "strategy.nproc_per_node=2"]}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_runs_with_augmenting_dataloader_workers_are_bitwise_equal(runs, strategy):
    # two runs of one command: the run cache keys them apart by a variable nothing reads
    first, second = (runs.train([*JITTERED, *STRATEGIES[strategy]],
                                env=user_code_env(env={"HYDRA_DIST_TEST_REPEAT": repeat})).ok()
                     for repeat in ("1", "2"))
    losses = losses_by_step(first.run_dir)
    assert sorted(losses) == list(range(1, 17)), losses  # 512 samples / 64 per step x 2 epochs
    assert losses_by_step(second.run_dir) == losses
    [last] = sorted((first.run_dir / "checkpoints").glob("step-*.pt"))[-1:]
    assert state_digest(second.run_dir / "checkpoints" / last.name) == state_digest(last)
