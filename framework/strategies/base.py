"""The engine interface: what a strategy is, in three parts, each a small object of its own.

    starter       how the training processes start (framework/strategies/starters.py: InProcess, Elastic, Horovod)
    join()        the process group a worker joins: rank, world, device and the collectives
                  (framework/training/engine.py: ProcessGroup, LocalGroup; framework/strategies/groups.py)
    parallelize() what the loop trains: the model in the engine's wrapper, its optimizer, the precision that runs
                  backward and the step, the checkpoint IO (a Wrapped, framework/training/engine.py)

and what the driver asks before any worker starts: validate(), check_model(model), check_task(model, example, train),
save_settings(run_dir), checkpoint_format. A strategy is built from its own typed options (`Options`, a dataclass in
framework/config/strategy_options.py or the user's package) and the few trainer settings an engine must agree with
(EngineSettings: precision, batch, accumulation, clipping, compile, cuda). join() and parallelize() are abstract:
a strategy that forgets one cannot be built, and so is a process group that forgets a collective.

Abilities only some engines have are protocols the loop asks for (framework/training/engine.py: GradientSync for
accumulation without reducing, SlotSplit for one process on several GPUs); telemetry measures what parallelize()
returned by itself (framework/training/instrument.py)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from framework.config.strategy_options import StrategyOptions
from framework.config.trainer import EngineSettings
from framework.models.blocks import auto_units
from framework.strategies.starters import Starter
from framework.training.checkpoint_io import FILE, CheckpointFormat
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.speedups import SpeedupModules

# (the wrapped model's parameters, and where the engine knows them, their names in the user's model: names=[...]) ->
# its optimizer; the names decide optimizer.param_groups where the engine replaced or dropped parameters
MakeOptimizer = Callable[..., torch.optim.Optimizer]


class Strategy(ABC):
    Options: type[StrategyOptions] = StrategyOptions
    # Why this engine cannot train channels_last parameters (None: it can). trainer.channels_last=auto then stays
    # off, and an explicit true is refused before any worker starts.
    channels_last_refusal: str | None = None
    # True: parallelize() takes the model in CPU memory and puts it on the device itself (piece by piece)
    moves_model_itself = False
    # Kinds of outer ranks (framework.session.environment: TORCH, HOROVOD) that another program (torchrun, srun,
    # horovodrun) started and this strategy can train with (its starter's, framework/strategies/starters.py); under
    # any other, the driver refuses it before training. Known from the class, before any strategy is built.
    outer_kinds: frozenset[str] = frozenset()

    def __init__(self, options: StrategyOptions, trainer: EngineSettings, starter: Starter,
                 checkpoint_format: CheckpointFormat = FILE):
        self.options, self.trainer, self.name = options, trainer, options.name
        self.starter = starter
        self.checkpoint_format = checkpoint_format

    @property
    def muon_steps(self) -> str:
        """What ranks step under this engine, for optimizer=muon (framework/strategies/muon_engines.py): "whole"
        matrices with the same averaged gradients (proven equal to one process), "shards" (DTensors), "flat" buffers,
        or "unproven". An engine that knows says so with a class attribute."""
        return "shards" if self.checkpoint_format.sharded else "unproven"

    def validate(self) -> None:
        """Raise ConfigError for settings this strategy cannot run with on this machine (its own options' types
        and ranges were checked when they were typed); in the driver, before any worker starts."""

    def check_model(self, model: nn.Module) -> None:
        """Raise ConfigError when this strategy's options do not fit the model (built once in the driver)."""

    def check_task(self, model: nn.Module, example, train) -> None:
        """Raise ConfigError when the model's forward or the training split cannot run the way this engine runs them
        (pipeline stages; a stream model-parallel peers must read alike), given `example`, a batch of one real input
        as the model takes it, and `train`, the built training split (in the driver, after the dry run)."""

    def batch_shares(self) -> int:
        """Over how many processes each global batch is split (each reads its own share of the data): every process
        here; a mesh's data-parallel ranks only (its tensor- and pipeline-parallel peers read the same share)."""
        return self.starter.processes()

    def speedup_modules(self, model: nn.Module) -> SpeedupModules:
        """The blocks trainer.activation_checkpointing recomputes one at a time (framework/models/blocks.py), and
        what trainer.compile compiles in place before parallelize(): here the whole model, one graph inside the
        engine's wrapper (an engine that compiles in parallelize() with its own mechanism names none)."""
        return SpeedupModules(recomputed=auto_units(model), compiled=[model])

    def save_settings(self, run_dir: Path) -> None:
        """Write settings the engine generated into the run folder (e.g. its own config), before workers start."""

    @abstractmethod
    def join(self) -> ProcessGroup:
        """Every worker, first: join the job (device chosen and made current, process group formed)."""

    @abstractmethod
    def parallelize(self, model: nn.Module, make_optimizer: MakeOptimizer, group: ProcessGroup) -> Wrapped:
        """The user's model (on the device unless moves_model_itself) in the engine's wrapper, its optimizer built
        by make_optimizer from the wrapped model's parameters, the precision and the checkpoint IO."""
