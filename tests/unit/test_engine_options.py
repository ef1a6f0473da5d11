"""The engines' own options, in this process: what the driver refuses for fsdp, deepspeed and horovod (one line each,
before any worker starts: support.driver.driver_says; a refusal as a real process is tests/runs/test_refusals.py's),
DeepSpeed's precision section, the arithmetic of the every-GPU runs, and a missing engine's one line (as a real
process with the engine hidden: tests/runs/test_refusals.py). Their runs: tests/engines/."""
import sys

import pytest
import torch

from support.driver import driver_says, strategy_for
from support.processes import TINY
from support.references import ADAM, STEPS, deepspeed_on_every_gpu


@pytest.mark.parametrize("overrides,message", [
    (["strategy.shard_modules=[NoSuchBlock]"],
     "strategy.shard_modules=['NoSuchBlock'] is not allowed: LeNet has no submodule of class NoSuchBlock"),
    (["strategy.shard_modules=[]"], "strategy.shard_modules=[] is not allowed: expected auto"),
    (["strategy.shard_modules=every"], "strategy.shard_modules='every' is not allowed: expected auto"),
    (["strategy.reshard_after_forward=maybe"],
     "strategy.reshard_after_forward='maybe' is not allowed: expected true or false"),
    (["strategy.cpu_offload=true"], "strategy.cpu_offload=true is not allowed without GPUs"),
    (["trainer.precision=fp16"], "trainer.precision=fp16 is not allowed with strategy=fsdp"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=fsdp"),
])
def test_bad_fsdp_values_fail_in_the_driver(tmp_path, overrides, message):
    line = driver_says(["strategy=fsdp", "strategy.nproc_per_node=2", *ADAM, *overrides], tmp_path)
    assert message in line, line


@pytest.mark.parametrize("overrides,message", [
    (["strategy.zero_stage=4"], "strategy.zero_stage=4 is not allowed: expected 0, 1, 2 or 3"),
    (["strategy.zero_stage=0", "strategy.offload_optimizer=true"],
     "strategy.offload_optimizer=true is not allowed with strategy.zero_stage=0"),
    (["+strategy.config.gradient_accumulation_steps=4"],
     "strategy.config.gradient_accumulation_steps=4 is not allowed: it contradicts trainer.grad_accum=1"),
    (["strategy.zero_stage=1", "+strategy.config.zero_optimization.stage=3"],
     "strategy.config.zero_optimization.stage=3 is not allowed: it contradicts strategy.zero_stage=1"),
    (["+strategy.config.optimizer.type=Adam"], "strategy.config.optimizer is not allowed"),
    (["trainer.on_nonfinite=skip"], "trainer.on_nonfinite=skip is not allowed with strategy=deepspeed"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=deepspeed"),
    (["strategy.zero_stage=0", "trainer.precision=fp16"],
     "trainer.precision=fp16 is not allowed with strategy=deepspeed on the CPU"),
    *((["trainer.precision=fp16", f"strategy.zero_stage={stage}"],
       f"trainer.precision=fp16 is not allowed with strategy=deepspeed strategy.zero_stage={stage}: DeepSpeed's ZeRO "
       "optimizer (stages 1-3) clips fp16's still-scaled gradients and never lowers its loss scale; use "
       "trainer.precision=bf16, or strategy.zero_stage=0") for stage in (1, 2, 3)),
])
def test_bad_deepspeed_values_fail_in_the_driver(tmp_path, overrides, message):
    pytest.importorskip("deepspeed")
    line = driver_says(["strategy=deepspeed", "strategy.nproc_per_node=2", *overrides, *ADAM], tmp_path)
    assert message in line, line


@pytest.mark.parametrize("precision,dtype", [("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", None)])
def test_mixed_precision_is_deepspeeds_own_autocast_and_no_autocast_of_ours_wraps_the_engine(precision, dtype):
    """DeepSpeed >= 0.17.6 turns an outer torch.autocast off inside engine.forward, while its bf16/fp16 sections
    cast the parameters: fp32 images into a bf16 Conv2d failed at step 1 on every GPU. The engine gets its own
    torch_autocast section (parameters stay fp32) and the loop's autocast around it is none. torch.is_autocast_enabled
    is asked per device type: without one it reports CUDA only."""
    pytest.importorskip("deepspeed")
    from framework.strategies.deepspeed import DeepSpeedPrecision

    config = strategy_for("strategy=deepspeed", f"trainer.precision={precision}").engine_config(2)
    assert config["torch_autocast"] == ({"enabled": True, "dtype": dtype} if dtype else {"enabled": False})
    assert config["bf16"] == {"enabled": False} and config["fp16"] == {"enabled": False}
    with DeepSpeedPrecision(precision, torch.device("cpu"), engine=None).autocast():
        assert not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda")


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 5, 8])
def test_the_every_gpu_run_has_its_steps_on_any_number_of_gpus(gpus):
    """The GPU test below, checked here for the machines it may run on: its data holds STEPS steps in one epoch."""
    args = dict(a.split("=", 1) for a in deepspeed_on_every_gpu(gpus, 2, "bf16"))
    batch, samples = int(args["trainer.batch_size"]), int(args["dataset.max_train_samples"])
    assert int(args["trainer.max_steps"]) == STEPS and samples // batch == STEPS and batch % (gpus * 2) == 0


@pytest.mark.parametrize("args,message", [
    (["strategy.np=0"], "strategy.np=0 is not allowed: expected an integer >= 1 or null"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=horovod"),
    (["strategy.compression=bf16"], "strategy.compression=bf16 is not allowed with strategy=horovod: Horovod's "
                                     "compressors are none and fp16; allowed: none, fp16"),
    (["strategy.op=max"], "strategy.op='max' is not allowed: expected one of average, sum, adasum"),
    (["strategy.op=adasum"], "strategy.op=adasum is not allowed with this horovod build: Adasum needs horovod built with MPI"),
    (["strategy.backward_passes_per_step=4"],
     "strategy.backward_passes_per_step=4 is not allowed: it is trainer.grad_accum (1), the one setting"),
    (["strategy.hosts=node1"], "strategy.hosts='node1' is not allowed: expected HOST:SLOTS[,HOST:SLOTS...]"),
    (["strategy.hosts=localhost:1", "strategy.np=2"], "strategy.np=2 is not allowed with strategy.hosts='localhost:1'"),
    (["strategy.np=3", "trainer.batch_size=64"], "trainer.batch_size=64 is not allowed with 3 process(es)"),
], ids=["np", "channels_last", "compression", "op", "adasum", "backward_passes", "hosts_form", "hosts_slots",
        "batch_split"])
def test_bad_horovod_values_fail_before_any_worker_starts(tmp_path, args, message):
    line = driver_says(["strategy=horovod", *args, *TINY], tmp_path)
    assert message in line, line


@pytest.mark.parametrize("engine,module,install", [
    ("deepspeed", "deepspeed", "pip install '.[deepspeed]'"),
    ("horovod", "horovod", "install it with: bash scripts/setup.d/10-horovod.sh .venv"),
])
def test_without_the_engine_the_strategy_says_how_to_install_it(tmp_path, monkeypatch, engine, module, install):
    """As if the package were not installed (None in sys.modules is Python's own way to make an import fail; its
    submodules another test imported go too)."""
    for name in [n for n in sys.modules if n.startswith(f"{module}.")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)
    line = driver_says([f"strategy={engine}", *TINY], tmp_path)
    assert install in line, line
    assert {"deepspeed": "DeepSpeed is not installed",
            "horovod": "strategy=horovod is not allowed: horovod is not usable here"}[engine] in line, line
