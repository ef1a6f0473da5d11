"""A user's own engine, written from framework.strategies.base.Strategy alone: data parallelism by hand, as d2l.ai's
"Multiple GPUs" chapter builds it from scratch. Its processes start like ddp's (torch's elastic agent, or torchrun)
and join a torch.distributed group; parallelize() broadcasts rank 0's parameters, and before each optimizer step
every gradient is averaged over the ranks, one all-reduce per parameter. One option of its own: every rank says
`banner` once it has joined. Its options are a dataclass (the schema the driver types strategy.* with): the elastic
launch options (nproc_per_node, backend, nnodes, timeout, ...) plus `banner`. It is built with the ranks its process
was started with (None where nobody did: the driver of a direct run), which its starter and its group take."""
from dataclasses import dataclass

import torch.distributed as dist

from framework.config.rules import non_empty_text, rule
from framework.config.strategy_options import ElasticOptions
from framework.strategies.base import Strategy
from framework.strategies.groups import TorchGroup
from framework.strategies.starters import Elastic
from framework.training.checkpoint_io import CheckpointIO
from framework.training.engine import Wrapped
from framework.training.precision import Precision


@dataclass
class AnnouncingOptions(ElasticOptions):
    banner: str = rule("hello", non_empty_text())  # what every rank says when it has joined


class AveragedGradients(Precision):
    """The run's precision (autocast, loss scaling, clipping), with every rank's gradients averaged before the step."""

    def optimizer_step(self, model, optimizer, max_norm, skip_nonfinite) -> bool:
        world = dist.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        return super().optimizer_step(model, optimizer, max_norm, skip_nonfinite)


class AnnouncingDDP(Strategy):
    Options = AnnouncingOptions
    outer_kinds = Elastic.outer_kinds  # the ranks torchrun and SLURM started are ours to train with too

    def __init__(self, options: AnnouncingOptions, trainer, ranks):
        backend = ("nccl" if trainer.cuda else "gloo") if options.backend == "auto" else options.backend
        super().__init__(options, trainer, Elastic(options, trainer.cuda, backend, trainer.log_all_ranks, ranks))

    def join(self):
        group = TorchGroup.join(self.starter.ranks, self.starter.backend, self.trainer.cuda, self.options.timeout)
        print(f"[{self.name}] rank {group.rank}/{group.world_size} joined: {self.options.banner}", flush=True)
        return group

    def parallelize(self, model, make_optimizer, group):
        for p in model.parameters():  # every rank starts from rank 0's weights
            dist.broadcast(p.data, src=0)
        return Wrapped(model, make_optimizer(model.parameters()), AveragedGradients(self.trainer.precision, group.device),
                       CheckpointIO(group.rank, group.world_size, group.cuda_devices), model)
