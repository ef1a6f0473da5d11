"""DeepSpeed: ZeRO stages 0-3 through DeepSpeed's engine. Workers start exactly like ddp (torch's elastic
agent or an outer torchrun; DeepSpeed reads the same environment) and join the same process group:
gloo on CPU with DeepSpeed's cpu accelerator, nccl on CUDA. DeepSpeed is imported only in the workers
of a deepspeed run, so the other strategies never need it installed."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from framework.config.strategy_options import DeepSpeedOptions
from framework.common.errors import ConfigError
from framework.session.environment import Ranks
from framework.strategies.deepspeed_config import CONFIG_FILE, deepspeed_config
from framework.strategies.torch_distributed import ElasticStrategy
from framework.telemetry.wait_clock import WaitClock, start_when_gradients_are_done
from framework.training.checkpoint_io import CheckpointFormat, CheckpointIO
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.precision import Precision
from framework.training.speedups import SpeedupModules

INSTALL_HINT = "install it with `pip install '.[deepspeed]'` (or `make setup`, which also builds it)"


def import_deepspeed():
    try:
        import deepspeed  # an optional engine: only the workers of a deepspeed run import it
    except ImportError as exc:
        raise RuntimeError(f"strategy=deepspeed cannot import DeepSpeed ({exc}); {INSTALL_HINT}") from exc
    return deepspeed


class DeepSpeedPrecision(Precision):
    """The engine owns mixed precision (its torch_autocast section: engine.forward runs under autocast), loss
    scaling, gradient reduction, clipping and the step. No autocast of ours wraps the engine: DeepSpeed would switch
    its own off inside. The loop calls backward once per micro-batch (loss already divided by grad_accum) and
    optimizer_step once per grad_accum micro-batches; DeepSpeed wants step() after every micro-batch and counts the
    accumulation boundary itself."""

    def __init__(self, name: str, device: torch.device, engine):
        super().__init__(name, device)
        self.scaler = None  # fp16 loss scaling is DeepSpeed's, saved in its checkpoint
        self.engine = engine

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the loop divided by grad_accum already
        if not self.engine.is_gradient_accumulation_boundary():
            self.engine.step()  # counts the micro-batch; no update before the boundary

    def optimizer_step(self, model, optimizer, max_norm, skip_nonfinite: bool) -> bool:
        self.engine.step()  # the boundary: reduce (ZeRO: reduce-scatter), clip to gradient_clipping, update
        return True


class DeepSpeedWrapped(Wrapped):
    def wait_clock(self, group: ProcessGroup) -> WaitClock | None:
        """OwnClock: ZeRO 0-2 reduce inside the backward of an accumulation's last micro-batch. ZeRO-3 gathers every
        layer's parameters in forward, inside its prefetching, where a wait cannot be told from work: None."""
        if self.model.zero_optimization_stage() >= 3:
            return None
        clock = WaitClock(group.device, ends_with_backward=True)
        start_when_gradients_are_done(self.module, clock)
        return clock

    def close(self) -> None:
        self.model.destroy()  # the engine's hooks and buffers, before the process group goes


def pin_deepspeed_to(device: torch.device) -> None:
    """DeepSpeed picks its GPU from LOCAL_RANK, at initialize and again inside ZeRO-3 at run time. With one GPU
    visible per task (SLURM --gpus-per-task, --gpu-bind) local rank 1 has only cuda:0, so LOCAL_RANK is set to
    the GPU this rank already uses (ddp's local rank modulo the visible GPUs); nothing else here reads it later."""
    os.environ["LOCAL_RANK"] = str(device.index)


def zero_format(stage: int) -> CheckpointFormat:
    """DeepSpeed's own checkpoint folder; a ZeRO-n checkpoint only loads into a ZeRO-n engine, and ZeRO's partitions
    (and DeepSpeed's file names) follow the world size that wrote them."""
    name = f"deepspeed-zero{stage}"
    return CheckpointFormat(name, (name,), sharded=True, reshards=False)


class DeepSpeedStrategy(ElasticStrategy):
    Options = DeepSpeedOptions
    options: DeepSpeedOptions
    channels_last_refusal = "DeepSpeed flattens the parameters into one buffer, which needs their default layout"
    _worker_modules = ("deepspeed",)
    muon_steps = "flat"

    def __init__(self, options: DeepSpeedOptions, trainer, ranks: Ranks | None):
        super().__init__(options, trainer, ranks, zero_format(options.zero_stage))

    def _worker_environment(self, cuda: bool) -> dict[str, str]:
        # Read by DeepSpeed at import; without it DeepSpeed guesses the accelerator and, on a CPU machine, says so.
        return {"DS_ACCELERATOR": "cuda" if cuda else "cpu"}

    def validate(self) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(f"strategy=deepspeed is not allowed here: DeepSpeed is not installed; {INSTALL_HINT}")
        super().validate()
        if self.trainer.precision == "fp16" and self.options.zero_stage > 0:
            # DeepSpeed 0.19's ZeRO optimizer with torch_autocast float16 (stage_1_and_2.py, stage3.py: step) clips
            # the still-scaled gradients against a loss scale of 1 before its GradScaler unscales them again (each
            # step 1/65536 of the intended one), and an overflow returns before the GradScaler's update, so its
            # scale never comes down. ZeRO-0 unscales first (engine.py).
            raise ConfigError(f"trainer.precision=fp16 is not allowed with strategy=deepspeed strategy.zero_stage="
                              f"{self.options.zero_stage}: DeepSpeed's ZeRO optimizer (stages 1-3) clips fp16's "
                              "still-scaled gradients and never lowers its loss scale; use trainer.precision=bf16, or "
                              "strategy.zero_stage=0")
        if self.trainer.precision == "fp16" and not self.trainer.cuda:
            raise ConfigError("trainer.precision=fp16 is not allowed with strategy=deepspeed on the CPU: fp16 needs "
                              "CUDA; use bf16 or fp32")
        if self.trainer.on_nonfinite == "skip":
            raise ConfigError("trainer.on_nonfinite=skip is not allowed with strategy=deepspeed: DeepSpeed's engine "
                              "owns the optimizer step and cannot skip one on request (with fp16 its loss scaler "
                              "skips overflowing steps by itself); use trainer.on_nonfinite=stop")
        self.engine_config(self.starter.processes())  # raises on a strategy.config key that contradicts the config

    def engine_config(self, processes: int) -> dict:
        return deepspeed_config(self.options, self.trainer, processes)

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        return replace(super().speedup_modules(model), compiled=[])  # parallelize() calls engine.compile()

    def save_settings(self, run_dir: Path) -> None:
        text = json.dumps(self.engine_config(self.starter.processes()), indent=2)
        (run_dir / CONFIG_FILE).write_text(text + "\n")

    def join(self) -> ProcessGroup:
        for name, value in self._worker_environment(self.trainer.cuda).items():  # under torchrun & co. too
            os.environ.setdefault(name, value)
        group = super().join()
        if group.device.type == "cuda":
            pin_deepspeed_to(group.device)
        return group

    def parallelize(self, model: nn.Module, make_optimizer, group: ProcessGroup) -> Wrapped:
        """deepspeed.initialize wraps model and optimizer together. Evaluation runs through the engine too, so it
        computes in the run's precision (the engine's autocast)."""
        deepspeed = import_deepspeed()
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
        # DeepSpeed's ZeRO calls a torch collective that torch now marks deprecated; not the user's to fix.
        warnings.filterwarnings("ignore", message=r".*torch\.distributed\.\w+. is deprecated", category=FutureWarning)
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer(model.parameters()), config=self.engine_config(group.world_size),
            dist_init_required=False)
        if self.trainer.compile:
            # the engine's own: compiles the module it wraps in place, inside its ZeRO hooks
            engine.compile(backend=self.trainer.compile_backend)
        io = DeepSpeedCheckpoints(group.rank, group.world_size, group.cuda_devices, self.options.zero_stage)
        return DeepSpeedWrapped(engine, ds_optimizer, DeepSpeedPrecision(self.trainer.precision, group.device, engine),
                                io, engine.module)


class DeepSpeedCheckpoints(CheckpointIO):
    def __init__(self, rank: int, world_size: int, cuda_devices: list[int], zero_stage: int):
        super().__init__(rank, world_size, cuda_devices)
        self.zero_stage = zero_stage
        self.format = zero_format(zero_stage)

    def full_model_state(self, module: nn.Module) -> dict | None:
        """The user's module in fp32 in rank 0's CPU memory. ZeRO-3 partitions the parameters: they are gathered one
        module at a time (every rank takes part, DeepSpeed's GatheredParameters), so no GPU ever holds more than one
        module's parameters at once; ZeRO 0-2 keep them whole on every rank."""
        deepspeed = import_deepspeed()

        def gathered(params):
            return deepspeed.zero.GatheredParameters(params, modifier_rank=None)

        return state_module_by_module(module, gathered if self.zero_stage == 3 else None, self.is_main)

    def save_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        model.save_checkpoint(str(folder), tag=tag, save_latest=False)

    def load_shards(self, folder: Path, tag: str, model: nn.Module, optimizer) -> None:
        path, _ = model.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                        load_lr_scheduler_states=False)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load checkpoint {folder / tag}")


def state_module_by_module(module: nn.Module, gathered, keep: bool) -> dict | None:
    """module.state_dict() as fp32 CPU tensors, built one submodule at a time: `gathered(params)` (a context, or None
    when parameters are whole) makes that submodule's own parameters whole while they are copied. Every rank calls
    it (the gathers are collectives); only where keep is true are tensors copied, and the dict returned."""
    wanted = list(module.state_dict().keys())  # the keys and their order (under ZeRO-3 its tensors are empty shards)
    kept = set(wanted)
    state = {}
    for prefix, sub in module.named_modules(remove_duplicate=False):
        params = list(sub.named_parameters(recurse=False, remove_duplicate=False))
        context = gathered([p for _, p in params]) if gathered is not None and params else contextlib.nullcontext()
        with context:
            if not keep:
                continue
            for name, tensor in [*params, *sub.named_buffers(recurse=False, remove_duplicate=False)]:
                key = f"{prefix}.{name}" if prefix else name
                if key in kept and key not in state:
                    tensor = tensor.detach().cpu()
                    state[key] = tensor.float() if tensor.is_floating_point() else tensor
    if not keep:
        return None
    missing = [k for k in wanted if k not in state]
    if missing:  # a module whose state_dict() holds more than its parameters and buffers
        raise RuntimeError(f"the full model state misses {', '.join(missing[:5])}: {type(module).__name__}'s "
                           "state_dict() holds entries that are neither parameters nor buffers")
    return {k: state[k] for k in wanted}
