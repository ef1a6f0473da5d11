"""pytorch/examples' MNIST `Net` (log_softmax output, trained with NLLLoss; tests/support/user_code/mnist_example.py)
from the command line as a newcomer types it, under ddp with two gloo workers: a real run, whose workers import the
user's module. Its first tries and the DDP tutorial's dataset, in this process: tests/unit/test_custom_entries.py."""
from support.processes import TINY, user_code_env
from support.run_files import losses_by_step

NEWCOMER = ["model=custom", "model._target_=mnist_example.Net", "loss=custom", "loss._target_=torch.nn.NLLLoss"]


def test_the_mnist_examples_net_trains_with_nll_loss_under_ddp(runs):
    run = runs.train([*NEWCOMER, "strategy=ddp", *TINY], env=user_code_env()).ok()
    assert "training Net on fashion_mnist" in run.stdout
    result = run.result()
    assert result["processes"] == 2 and result["strategy"] == "ddp"
    assert result["test_acc"] > 0.5  # ten classes: chance is 0.1
    losses = list(losses_by_step(run.run_dir).values())
    assert losses[-1] < losses[0]
