"""The world-size-invariant mode's refusals (framework/config/invariant.py), each one line naming the key, its value
and what is allowed, on the real schemas, and a model keeping BatchNorm's running statistics (the driver's own
composition of them: tests/unit/test_bad_inputs.py), and the driver's GPU-only refusal with CUDA reported."""
import pytest
from torch import nn

from framework.common.errors import ConfigError
from framework.config.invariant import check_invariant
from framework.config.strategy_options import HorovodOptions, SingleOptions, preset
from framework.config.trainer import TrainerConfig
from framework.models.lenet import LeNet
from framework.training.invariant.batch_norm import refuse_running_statistics
from support.driver import driver_says
from support.fake_cuda import cuda_reported


def _refusal(micro_shards=8, dp_ranks=2, options=None, **trainer) -> str:
    with pytest.raises(ConfigError) as refused:
        check_invariant(TrainerConfig(micro_shards=micro_shards, **trainer), options or preset("ddp"), dp_ranks)
    line = str(refused.value)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("options", [SingleOptions(), preset("ddp")])
@pytest.mark.parametrize("ranks", [1, 2, 4, 8])
def test_single_and_ddp_pass_with_shards_every_worker_count_divides(options, ranks):
    check_invariant(TrainerConfig(batch_size=64), options, ranks)


@pytest.mark.parametrize("options", [preset("fsdp"), preset("hsdp"), preset("tp"), HorovodOptions()])
def test_an_engine_with_its_own_reduction_order_is_refused(options):
    assert _refusal(options=options).startswith(f"strategy={options.name} is not allowed with trainer.invariant=true:"
                                                " the world-size-invariant mode runs under strategy=single or ")


def test_a_user_engine_named_ddp_is_not_taken_for_ddp():
    assert _refusal(options=preset("ddp", _target_="my_project.engines.MyDDP")).startswith("strategy=ddp is not allowed")


def test_shards_that_a_worker_count_does_not_divide_are_refused():
    assert _refusal(micro_shards=6, dp_ranks=4).startswith(
        "trainer.micro_shards=6 is not allowed with 4 data-parallel ranks: it must be a multiple of every worker count")


@pytest.mark.parametrize("trainer, starts", [
    ({"batch_size": 100}, "trainer.batch_size=100 is not allowed with trainer.micro_shards=8: each micro-shard is"),
    ({"grad_accum": 2}, "trainer.grad_accum=2 is not allowed with trainer.invariant=true: each rank accumulates"),
    ({"deal_as_ranks": 2}, "trainer.deal_as_ranks=2 is not allowed with trainer.invariant=true"),
])
def test_trainer_keys_the_shards_replace_are_refused(trainer, starts):
    assert _refusal(**trainer).startswith(starts)


def test_fp16_and_nondeterministic_gpu_kernels_are_refused():
    assert _refusal(precision="fp16").startswith("trainer.precision=fp16 is not allowed with trainer.invariant=true")
    with pytest.raises(ConfigError, match=r"^trainer.deterministic=false is not allowed with trainer.invariant=true "
                                          "on GPUs"):
        check_invariant(TrainerConfig(batch_size=64), preset("ddp"), 2, cuda=True)
    check_invariant(TrainerConfig(batch_size=64, deterministic=True), preset("ddp"), 2, cuda=True)


def test_sync_batchnorm_and_compression_are_refused():
    assert _refusal(options=preset("ddp", sync_batchnorm=True)).startswith(
        "strategy.sync_batchnorm=true is not allowed with trainer.invariant=true")
    assert _refusal(options=preset("ddp", compression="fp16")).startswith(
        "strategy.compression=fp16 is not allowed with trainer.invariant=true")


def test_a_model_keeping_batchnorm_running_statistics_is_refused_naming_the_layer():
    refuse_running_statistics(LeNet((1, 28, 28), 10), "lenet")
    refuse_running_statistics(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)), "x")
    with pytest.raises(ConfigError, match=r"^model=cnn is not allowed with trainer.invariant=true: its BatchNorm2d "
                                          r"'1' keeps running statistics, which each rank updates"):
        refuse_running_statistics(nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4)), "cnn")


@pytest.mark.parametrize("strategy", [["strategy=single"], ["strategy=ddp", "strategy.nproc_per_node=2"]])
@pytest.mark.parametrize("deterministic", ["false", "warn"])
def test_the_driver_on_a_gpu_machine_refuses_the_mode_without_deterministic_kernels(tmp_path, monkeypatch, strategy,
                                                                                   deterministic):
    """The driver's CUDA branch (CUDA reported, 2 GPUs): the refusal comes before any worker starts, for the GPU run
    the accelerator chose (auto) as for one that named it; with CPU workers the kernels need no switch."""
    cuda_reported(monkeypatch, 2, True)
    args = ["trainer.invariant=true", "dataset=synthetic", "trainer.batch_size=64", *strategy,
            f"trainer.deterministic={deterministic}"]
    for accelerator in ("auto", "gpu"):
        assert driver_says([*args, f"trainer.accelerator={accelerator}"], tmp_path / accelerator).startswith(
            f"trainer.deterministic={deterministic} is not allowed with trainer.invariant=true on GPUs")
    assert driver_says([*args, "trainer.accelerator=cpu"], tmp_path / "cpu") == ""
