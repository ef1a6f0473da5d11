"""The process groups a strategy's workers join: torch.distributed's (ddp, fsdp, deepspeed, and any engine started
like them) and Horovod's. framework/training/engine.py has the interface and LocalGroup (one process)."""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from framework.launch.horovod_runner import broadcast_from_rank0
from framework.session.environment import Ranks, threads_per_worker
from framework.session.store import launch_store
from framework.training.engine import ProcessGroup


def torch_device(cuda: bool, local_rank: int) -> torch.device:
    """This worker's device: with GPUs the one its local rank picks among those it sees (made current; under
    SLURM's --gpus-per-task it sees one, so local rank 1 takes cuda:0), else the CPU."""
    if not cuda:
        return torch.device("cpu")
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


class TorchGroup(ProcessGroup):
    """torch.distributed's default group, joined at the ranks whoever started this process gave it (torch's elastic
    agent, torchrun, SLURM tasks: the Ranks the strategy was handed), over their rendezvous store."""

    @classmethod
    def join(cls, ranks: Ranks, backend: str, cuda: bool, timeout_s: float) -> "TorchGroup":
        rank, local_rank, world_size = ranks.rank, ranks.local_rank, ranks.world_size
        device = torch_device(cuda, local_rank)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads_per_worker(ranks.local_world_size))))
        if not dist.is_initialized():
            dist.init_process_group(
                backend, store=launch_store(rank, world_size), rank=rank, world_size=world_size,
                timeout=datetime.timedelta(seconds=timeout_s), device_id=device if device.type == "cuda" else None)
        return cls(rank, local_rank, world_size, device)

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t.contiguous())
        return torch.stack(out)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    def gather_objects(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        box = [obj]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def leave(self, wait_for_peers: bool) -> None:
        """With wait_for_peers, only once every rank got here (rank 0's store outlives the others). With nccl, one
        rank waiting for a peer that already left hangs until the group's timeout."""
        if dist.is_initialized():
            if wait_for_peers:
                dist.barrier()
            dist.destroy_process_group()


class HorovodGroup(ProcessGroup):
    """Horovod's own collectives (its gloo controller, or NCCL on GPUs); no torch.distributed group exists."""

    @classmethod
    def join(cls, hvd, cuda: bool) -> "HorovodGroup":
        hvd.init()
        device = torch_device(cuda, hvd.local_rank())
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads_per_worker(hvd.local_size()))))
        group = cls(hvd.rank(), hvd.local_rank(), hvd.size(), device)
        group.hvd = hvd
        return group

    def all_gather(self, t: torch.Tensor) -> torch.Tensor:
        return self.hvd.allgather(t.unsqueeze(0).contiguous())

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(t, op=self.hvd.Sum)

    def gather_objects(self, obj) -> list:
        return self.hvd.allgather_object(obj)

    def broadcast_object(self, obj):
        return broadcast_from_rank0(self.hvd, obj)

    def barrier(self) -> None:
        self.hvd.barrier()

    def leave(self, wait_for_peers: bool) -> None:
        if self.hvd.is_initialized():
            if wait_for_peers:
                self.hvd.barrier()
            self.hvd.shutdown()
