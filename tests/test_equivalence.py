"""DDP is exact: 2 gloo workers and one process, same global batch and seed, fp32, give the same losses.

Each rank takes rank::2 of the same epoch permutation, so the two micro-batches of a step are exactly the
single process's batch, and DDP averages the gradients. The only difference left is summation order
(about 1e-7 relative, measured), well inside the 1e-5 bound."""
import pytest

from conftest import assert_curves_match, train_loss_curve

COMMON = ["trainer.max_steps=10", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
          "dataset.max_train_samples=1024", "dataset.max_test_samples=256"]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_ddp_two_workers_matches_single_process_for_ten_steps(tmp_path, optimizer):
    losses = {}
    for strategy in ("single", "ddp"):
        losses[strategy] = train_loss_curve([f"strategy={strategy}", f"optimizer={optimizer}", *COMMON],
                                            tmp_path / strategy)
    assert [s for s, _ in losses["single"]] == list(range(1, 11))
    assert [s for s, _ in losses["ddp"]] == list(range(1, 11))
    assert_curves_match(losses["single"], losses["ddp"], 1e-5, ("single", "ddp"))
    assert losses["single"][-1][1] < losses["single"][0][1]


def test_in_memory_input_path_matches_the_dataloader_path(tmp_path):
    """The fast path (whole split on the device, index gather) trains exactly like DataLoader + DistributedSampler."""
    losses = {}
    for in_memory in ("true", "false"):
        losses[in_memory] = train_loss_curve(["strategy=ddp", "strategy.nproc_per_node=2",
                                              f"dataset.in_memory={in_memory}", "trainer.num_workers=0", *COMMON],
                                             tmp_path / in_memory)
    assert losses["true"] == losses["false"]


def test_losses_kept_on_the_device_between_log_boundaries_average_the_logged_steps(tmp_path):
    """The loop never reads the loss per step: it sums on the device and reads once per log interval. The
    interval means of a run logged every 5 steps equal the means of the same run's per-step losses."""
    every_step = dict(train_loss_curve(["strategy=single", *COMMON], tmp_path / "every_step"))
    five = [a if not a.startswith("trainer.log_every_n_steps=") else "trainer.log_every_n_steps=5" for a in COMMON]
    every_five = train_loss_curve(["strategy=single", *five], tmp_path / "every_five")
    assert [s for s, _ in every_five] == [5, 10]
    for step, mean in every_five:
        expected = sum(every_step[s] for s in range(step - 4, step + 1)) / 5
        assert abs(mean - expected) <= 1e-6 * abs(expected), f"steps {step - 4}-{step}: {mean} vs {expected}"
