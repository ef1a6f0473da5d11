"""The one interface every strategy answers; the loop, the driver, the launchers and the checkpoints know nothing
else about it. Every method anyone calls is declared here, with a default that fits one process on one device.

Driver      validate(), check_model(model), processes(), describe(), save_settings(run_dir), launch(entry, payload)
Joining     setup(), teardown(), leave_group(wait_for_peers); rank, local_rank, world_size, device, is_main
Wrapping    wrap(model, make_optimizer) -> Wrapped (model, optimizer, precision, wait clock); unwrap(model),
            eval_model(model), sync(model, on)
Slots       local_slots(), cuda_devices(), slot_sizes(batch)
Collectives all_gather(t), all_reduce_sum(t), gather_objects(obj), broadcast_object(obj), barrier()
Checkpoints `checkpoints`: a CheckpointIO (framework/strategies/checkpoint_io.py; file by default)

A strategy is built from its own typed options (`Options`, a dataclass in framework/config/strategy_options.py or
the user's package) and the trainer's (precision, batch, accumulation: what it must agree with). A "slot" is one
GPU's share of the work: one per process for ddp, one per replica for dp; per-slot meters are TensorBoard's rank{r}.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from framework.config.strategy_options import StrategyOptions
from framework.config.trainer import TrainerConfig
from framework.strategies.checkpoint_io import CheckpointIO, FileCheckpoints
from framework.training.precision import Precision
from framework.training.speedups import original_module


@dataclass
class Wrapped:
    """What the loop trains with, as the strategy wrapped it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    # measures the time each slot waits for the others (framework/telemetry/wait_clock.py, replica_clock.py);
    # None where the strategy cannot see its waits (busy is then the whole step, and no wait is reported)
    clock: Any = None


class Strategy:
    Options = StrategyOptions
    runs_in_process = True  # launch() trains in the driver process (so the driver handles Ctrl-C for it)
    # Kinds of outer launcher (framework.process.environment: TORCH, HOROVOD) whose already-started workers this
    # strategy can train with; under any other, the driver refuses it before training.
    outer_launchers: frozenset[str] = frozenset()
    # Why this strategy cannot train channels_last parameters (None: it can). trainer.channels_last=auto then stays
    # off, and an explicit true is refused before any worker starts.
    channels_last_refusal: str | None = None
    # True: wrap() takes the model in CPU memory and puts it on the device itself (piece by piece)
    moves_model_itself = False

    def __init__(self, options: StrategyOptions, trainer: TrainerConfig):
        self.options, self.trainer = options, trainer
        self.name = options.name
        self.use_cuda = trainer.cuda_wanted
        self.rank, self.local_rank, self.world_size = 0, 0, 1
        self.device = torch.device("cpu")
        self.checkpoints: CheckpointIO = FileCheckpoints(self)
        self.clock = None  # the wait clock wrap() made, if any (barriers count as waiting on it)

    # ---- driver side -------------------------------------------------------------------------
    def validate(self) -> None:
        """Raise ConfigError for settings this strategy cannot run with this trainer config on this machine (its
        own options' types and ranges were checked when they were typed); called before any worker starts."""

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

    def launch(self, entry: Callable[[Any], Any], payload: Any) -> Any:
        """Start the workers and return rank 0's result. Default: this process is the only worker."""
        return entry(payload)

    # ---- joining -----------------------------------------------------------------------------
    def setup(self) -> None:
        """Join the job (process group, device); every worker, before anything else."""
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.use_cuda else torch.device("cpu")

    def leave_group(self, wait_for_peers: bool) -> None:
        """Leave the job's process group; with wait_for_peers, only once every rank got here (so nobody leaves
        while a peer still talks to it). Every rank must pass the same wait_for_peers."""

    def teardown(self) -> None:
        """The worker is done (or failed): leave the group, free the engine."""
        self.leave_group(wait_for_peers=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ---- wrapping ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module, make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> Wrapped:
        """The model (on the device, in the strategy's wrapper), its optimizer (built by make_optimizer from the
        wrapped model's parameters), the precision that runs backward and the step, and the wait clock."""
        return Wrapped(model, make_optimizer(model.parameters()), Precision(self.trainer.precision, self.device))

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

    def optimizer_state_bytes(self, optimizer) -> int:
        """Bytes of optimizer state this process holds (logged per rank; a sharding engine counts its shard)."""
        return sum(t.numel() * t.element_size() for state in optimizer.state.values()
                   for t in state.values() if torch.is_tensor(t))

    # ---- slots -------------------------------------------------------------------------------
    def local_slots(self) -> int:
        """GPUs (replicas) this process drives."""
        return 1

    def cuda_devices(self) -> list[int]:
        """Indices of the GPUs this process trains on (its RNG streams are checkpointed, its memory metered)."""
        return [self.device.index] if self.device.type == "cuda" else []

    def slot_sizes(self, batch: int) -> list[int]:
        """How one local micro-batch splits over this process's slots (GPUs)."""
        return [batch]

    # ---- collectives -------------------------------------------------------------------------
    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        """Stack t from every process along a new first dimension (rank order)."""
        return t.unsqueeze(0)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_objects(self, obj) -> list:
        """Every process's obj, in rank order, on every process."""
        return [obj]

    def broadcast_object(self, obj):
        """Rank 0's obj on every process (the others pass anything, e.g. None)."""
        return obj

    def barrier(self) -> None:
        pass
