"""trainer.channels_last and trainer.compile change speed, never results: real LeNet forward and backward
passes compared with the plain model (activation checkpointing: tests/test_compile_and_recompute.py)."""
import copy

import pytest
import torch

from framework.models.lenet import LeNet
from framework.training.speedups import apply_speedups, channels_last_applies, use_channels_last

CPU = torch.device("cpu")
SAMPLE = (1, 28, 28)


def lenet_and_batch():
    torch.manual_seed(0)
    return LeNet(SAMPLE, 10), torch.randn(8, *SAMPLE), torch.randint(0, 10, (8,))


def loss_and_grads(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def assert_same_training_step(plain, fast, x, y, fast_x=None):
    loss_a, grads_a = loss_and_grads(plain, x, y)
    loss_b, grads_b = loss_and_grads(fast, x if fast_x is None else fast_x, y)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape, expected", [((1, 28, 28), True), ((3, 32, 32), True), ((5,), False), ((2, 5), False)])
def test_channels_last_applies_to_image_samples_only(shape, expected):
    assert channels_last_applies(shape) is expected


def test_no_speed_ups_leave_the_model_alone():
    model, _, _ = lenet_and_batch()
    assert apply_speedups(model, channels_last=False, device=CPU) is model


def test_channels_last_lenet_matches_the_plain_one():
    plain, x, y = lenet_and_batch()
    fast = apply_speedups(copy.deepcopy(plain), channels_last=True, device=CPU)
    conv_weight = fast.features[3].weight  # 20 input channels: the layouts differ
    assert conv_weight.is_contiguous(memory_format=torch.channels_last) and not conv_weight.is_contiguous()
    assert_same_training_step(plain, fast, x, y, fast_x=x.contiguous(memory_format=torch.channels_last))


def test_channels_last_is_skipped_for_flat_samples():
    model, _, _ = lenet_and_batch()
    assert use_channels_last(True, model, CPU, sample_shape=(784,)) is False


def test_compiled_lenet_matches_the_plain_one_and_keeps_its_names():
    """Compiled in place (nn.Module.compile): the state_dict keys stay the plain model's (no '_orig_mod.'), so runs
    with and without trainer.compile resume each other and weights files load anywhere."""
    plain, x, y = lenet_and_batch()
    fast = copy.deepcopy(plain)
    compiling = []
    fast.features[0].register_forward_hook(lambda *_: compiling.append(torch.compiler.is_compiling()))
    assert apply_speedups(fast, channels_last=True, device=CPU, compiled=[fast]) is fast
    assert_same_training_step(plain, fast, x, y, fast_x=x.contiguous(memory_format=torch.channels_last))
    assert compiling == [True], "the model's forward ran as traced by torch.compile"
    assert list(fast.state_dict()) == list(plain.state_dict())


@pytest.mark.parametrize("setting, model, device, shape, expected", [
    ("auto", "lenet", "cpu", SAMPLE, True),           # measured faster: LeNet says channels_last_helps
    ("auto", "simple_cnn", "cpu", SAMPLE, False),     # not measured faster: off unless asked for
    ("auto", "lenet", "cuda", SAMPLE, False),         # never measured on a GPU
    ("auto", "lenet", "cpu", (5,), False),            # flat samples have no channels
    (True, "simple_cnn", "cpu", SAMPLE, True),
    (False, "lenet", "cpu", SAMPLE, False),
])
def test_channels_last_auto_turns_on_where_it_was_measured_to_pay(setting, model, device, shape, expected):
    from framework.models.simple_cnn import SimpleCNN
    module = {"lenet": LeNet, "simple_cnn": SimpleCNN}[model](SAMPLE, 10)
    assert use_channels_last(setting, module, torch.device(device), shape) is expected


def test_channels_last_auto_stays_off_for_engines_that_flatten_parameters():
    assert use_channels_last("auto", LeNet(SAMPLE, 10), CPU, SAMPLE, strategy_ok=False) is False
