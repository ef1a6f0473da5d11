"""What the engines whose workers start and join like ddp's share: torch's elastic agent (or an outer torchrun /
SLURM) starts one process per GPU or CPU worker, which joins a torch.distributed group (ddp, fsdp, deepspeed and the
mesh engine build on ElasticStrategy)."""
from __future__ import annotations

import torch

from framework.common.errors import ConfigError
from framework.config.strategy_options import ElasticOptions
from framework.session.environment import Ranks
from framework.strategies.base import Strategy
from framework.strategies.groups import TorchGroup
from framework.strategies.starters import Elastic, Preload
from framework.training.checkpoint_io import FILE, CheckpointFormat
from framework.training.engine import ProcessGroup


class ElasticStrategy(Strategy):
    """Workers started and joined like ddp's: torch's elastic agent (or an outer torchrun / SLURM), one process per
    GPU or CPU worker, a torch.distributed group. Subclasses say what parallelize() makes."""

    Options = ElasticOptions
    options: ElasticOptions
    outer_kinds = Elastic.outer_kinds
    _describe_note = ""  # what the engine adds to the starter's line in hydra-dist-devices
    _worker_modules: tuple[str, ...] = ()  # the engine's own modules, imported once in the worker template
    # where more workers than GPUs are asked for, whether gloo (several workers per GPU) is a way out to suggest
    gloo_shares_gpus = True

    def __init__(self, options: ElasticOptions, trainer, ranks: Ranks | None,
                 checkpoint_format: CheckpointFormat = FILE):
        starter = Elastic(options, trainer.cuda, self.backend_for(options, trainer.cuda), trainer.log_all_ranks, ranks,
                          self._describe_note,
                          preload=Preload(self._worker_modules, self._worker_environment(trainer.cuda)))
        super().__init__(options, trainer, starter, checkpoint_format)

    def _worker_environment(self, cuda: bool) -> dict[str, str]:
        """Variables the engine's own modules read when imported (in the worker template)."""
        return {}

    def backend_for(self, options: ElasticOptions, cuda: bool) -> str:
        return ("nccl" if cuda else "gloo") if options.backend == "auto" else options.backend

    @property
    def backend(self) -> str:
        return self.starter.backend

    def validate(self) -> None:
        stall = self.trainer.stall_timeout
        if stall is not None and self.options.timeout <= stall:
            raise ConfigError(f"strategy.timeout={self.options.timeout:g} must be longer than trainer.stall_timeout="
                              f"{stall:g}: the stall watchdog names the stalled rank before the process group gives "
                              f"up; raise strategy.timeout (or lower trainer.stall_timeout)")
        if self.options.backend == "nccl" and not self.trainer.cuda:
            raise ConfigError("strategy.backend=nccl is not allowed without GPUs: nccl needs CUDA; use "
                              "strategy.backend=gloo (or auto) for CPU workers")
        if self.on_nccl_gpus():
            self._validate_one_gpu_per_worker()

    def _validate_one_gpu_per_worker(self) -> None:
        """nccl refuses two ranks on one GPU ("Duplicate GPU detected"), and each worker takes GPU local_rank modulo
        the GPUs it sees. Under SLURM/submitit each task may see GPUs of its own (--gpus-per-task), so only torch's
        launchers, whose workers all see the node's GPUs, are counted here."""
        gpus, workers, outer = torch.cuda.device_count(), self.starter.nproc_per_node(), self.starter.ranks
        if outer is None:
            if workers > gpus:
                raise ConfigError(
                    f"strategy.nproc_per_node={workers} is not allowed with nccl: this machine has {gpus} GPU(s) and "
                    f"nccl needs one GPU per worker; use at most {gpus}" + self._gloo_hint())
        elif outer.scheduler is None and workers > gpus:
            raise ConfigError(
                f"strategy={self.name} with nccl is not allowed with {workers} workers on this node: the launcher "
                f"started them (LOCAL_WORLD_SIZE={workers}) and the node shows each of them {gpus} GPU(s), so two "
                "workers would share a GPU, which nccl refuses; start at most {gpus} per node (torchrun "
                "--nproc-per-node)".replace("{gpus}", str(gpus)) + self._gloo_hint())

    def on_nccl_gpus(self) -> bool:
        return self.trainer.cuda and "nccl" in self.backend

    def _gloo_hint(self) -> str:
        return ", or strategy.backend=gloo" if self.gloo_shares_gpus else ""

    def join(self) -> ProcessGroup:
        return TorchGroup.join(self.starter.ranks, self.backend, self.trainer.cuda, self.options.timeout)

