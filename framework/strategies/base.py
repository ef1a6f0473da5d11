"""The one interface every strategy answers; the trainer and the driver know nothing else about it.

Driver side:  validate(cfg), check_model(model), processes(), describe(), save_settings(run_dir), launch(entry, payload)
Worker side:  setup(), wrap_model(model), wrap_optimizer(model, optimizer), make_precision(name), unwrap(model),
              sync(model, on), wait_clock, local_slots(), cuda_devices(), slot_sizes(n), all_gather(t), all_reduce_sum(t), gather_objects(obj), teardown(),
              and for engines that shard checkpoints: checkpoint_format, readable_formats, save/load_engine_checkpoint,
              restore_file_checkpoint (a single-file checkpoint into this strategy's model)

A "slot" is one GPU's share of the work: one per process for ddp, one per replica for dp.
Per-slot meters are what TensorBoard shows as rank{r}.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig
from torch import nn

from framework.config.checks import one_of
from framework.training.precision import Precision
from framework.training.speedups import original_module


def cuda_wanted(cfg: DictConfig) -> bool:
    accelerator = one_of(cfg, "trainer.accelerator", ["auto", "cpu", "gpu"])
    return accelerator == "gpu" or (accelerator == "auto" and torch.cuda.is_available())


class Strategy:
    name = "base"
    runs_in_process = True  # launch() trains in the driver process (so the driver handles Ctrl-C for it)
    # Kinds of outer launcher (framework.launch.environment: TORCH, HOROVOD) whose already-started workers this
    # strategy can train with; under any other, the driver refuses it before training.
    outer_launchers: frozenset[str] = frozenset()
    # Measures the time this rank waits for the others (framework/telemetry/wait_clock.py); None where the strategy cannot
    # see its waits: its busy time is then the whole step time and no wait is reported.
    wait_clock = None
    # True: HYDRA_DIST_FAULT=slow_rank:<s>:<r> slows slot r (a dp replica) inside the strategy, not the process
    slows_replicas = False
    # True: wrap_model takes the model in CPU memory and puts it on the device itself (piece by piece)
    moves_model_itself = False

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.options = cfg.strategy
        self.name = cfg.strategy.get("name") or type(self).name  # the config's name: a user's subclass has its own
        self.use_cuda = cuda_wanted(cfg)
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.device = torch.device("cpu")

    # ---- driver side -------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError for settings this strategy cannot run; called before any worker starts."""

    def check_model(self, model: nn.Module) -> None:
        """Raise ConfigError when this strategy's options do not fit the model (built once in the driver)."""

    def processes(self) -> int:
        """Training processes in the whole job; the global batch is split across them."""
        return 1

    def describe(self) -> str:
        """What launch() would start on this machine, in one line (shown by `hydra-dist-devices`)."""
        return f"{self.processes()} process(es) on {'the GPU' if self.use_cuda else 'the CPU'}"

    def save_settings(self, run_dir: Path) -> None:
        """Write strategy-generated settings into the run folder (e.g. the engine's config); before workers start."""

    def launch(self, entry: Callable[[dict], Any], payload: dict) -> Any:
        """Start the workers and return rank 0's result. Default: this process is the only worker."""
        return entry(payload)

    # ---- worker side -------------------------------------------------------------------------
    def setup(self) -> None:
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.use_cuda else torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def wrap_model(self, model: nn.Module) -> nn.Module:
        return model

    def wrap_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        """(model, optimizer) as the loop should use them; an engine may replace both (DeepSpeed)."""
        return model, optimizer

    def make_precision(self, name: str) -> Precision:
        """Autocast, backward and the optimizer step for trainer.precision=name."""
        return Precision(name, self.device)

    def optimizer_state_bytes(self, optimizer) -> int:
        """Bytes of optimizer state this process holds (logged per rank; a sharding engine overrides it)."""
        return sum(t.numel() * t.element_size() for state in optimizer.state.values()
                   for t in state.values() if torch.is_tensor(t))

    # Why this strategy cannot train channels_last parameters (None: it can). trainer.channels_last=auto
    # then stays off, and an explicit true is refused before any worker starts.
    channels_last_refusal: str | None = None

    @property
    def channels_last_ok(self) -> bool:
        return self.channels_last_refusal is None

    # ---- checkpoints ----------------------------------------------------------------------------
    # "file": rank 0 writes model + optimizer into one .pt (framework/checkpoints/store.py). Any other value
    # names an engine that writes a folder of shards from every rank through the two methods below; the
    # value is recorded in the manifest, and a checkpoint is only resumed by a strategy that reads its format.
    checkpoint_format = "file"
    # Whether this strategy's checkpoints load into another world size ("file" ones hold global state). False:
    # the driver refuses to resume them with another number of workers, before any worker starts.
    checkpoint_reshards = True

    @property
    def readable_formats(self) -> tuple[str, ...]:
        """The checkpoint formats this strategy resumes from."""
        return (self.checkpoint_format,)

    def restore_file_checkpoint(self, state: dict, model: nn.Module, optimizer, scaler):
        """Every rank: model, optimizer and scaler from a single-file checkpoint's state; returns (Position, totals)."""
        from framework.checkpoints.state import restore

        return restore(state, self.unwrap(model), optimizer, scaler, self.rank, self.world_size,
                       self.cfg.trainer.batch_size, self.cuda_devices())

    def save_engine_checkpoint(self, folder: Path, tag: str, model: nn.Module) -> None:
        """Every rank: write this rank's shards of model and optimizer into folder/tag."""
        raise NotImplementedError(f"strategy={self.name} writes single-file checkpoints")

    def load_engine_checkpoint(self, folder: Path, tag: str, model: nn.Module) -> None:
        """Every rank: load model and optimizer shards from folder/tag."""
        raise NotImplementedError(f"strategy={self.name} reads single-file checkpoints")

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside the strategy's wrapper and torch.compile's: what checkpoints hold, so runs
        with and without trainer.compile, or under another strategy, can resume each other."""
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        return original_module(model)

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The model to evaluate with; wrappers whose forward talks to other ranks are taken off."""
        return model

    def sync(self, model: nn.Module, on: bool):
        """Context for one micro-batch's backward; on=False may skip gradient sync (accumulation)."""
        return contextlib.nullcontext()

    def local_slots(self) -> int:
        """GPUs (replicas) this process drives."""
        return 1

    def cuda_devices(self) -> list[int]:
        """Indices of the GPUs this process trains on (its RNG streams are checkpointed, its memory metered)."""
        return [self.device.index] if self.device.type == "cuda" else []

    def slot_sizes(self, batch: int) -> list[int]:
        """How one local micro-batch splits over this process's slots (GPUs)."""
        return [batch]

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Stack t from every process along a new first dimension (rank order)."""
        return t.unsqueeze(0)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_objects(self, obj) -> list:
        """Every process's obj, in rank order, on every process."""
        return [obj]

    def barrier(self) -> None:
        pass

    def teardown(self) -> None:
        pass
