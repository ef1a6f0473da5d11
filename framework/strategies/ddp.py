"""DistributedDataParallel: one process per GPU (or per CPU worker on gloo), started by torch's elastic
agent, or by an outer torchrun / scheduler that already started us."""
from __future__ import annotations

import contextlib
import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

from framework.config.strategy_options import DDPOptions, ElasticOptions
from framework.errors import ConfigError
from framework.process.clean_exit import exit_at_end_of_finished_worker
from framework.launch.elastic import launch_elastic
from framework.process.environment import TORCH, launched_externally, threads_per_worker
from framework.process.slurm import scheduler_name
from framework.launch.store import launch_store
from framework.strategies.base import Strategy, Wrapped
from framework.telemetry.wait_clock import WaitClock
from framework.training.precision import Precision

CPU_WORKERS_WITHOUT_GPU = 2


def _timed_allreduce(clock, bucket):  # no annotations: DDP checks them, and this module's are strings
    """DDP's own all-reduce (scale by 1/world, then sum: the gradients are bit-identical to DDP without a hook),
    noting when each bucket became ready: after the last one, this rank's backward is done and it only waits."""
    clock.start()
    grads = bucket.buffer()
    grads.mul_(1.0 / dist.get_world_size())
    return dist.all_reduce(grads, async_op=True).get_future().then(lambda fut: fut.value()[0])


class ElasticStrategy(Strategy):
    """What every strategy whose workers start and join like ddp's shares: torch's elastic agent (or an outer
    torchrun / SLURM), one process per GPU or CPU worker, a torch.distributed process group and its collectives."""

    Options = ElasticOptions
    runs_in_process = False
    outer_launchers = frozenset({TORCH})
    options: ElasticOptions

    # ---- driver side -------------------------------------------------------------------------
    def nproc_per_node(self) -> int:
        if launched_externally():
            return int(os.environ["LOCAL_WORLD_SIZE"]) if "LOCAL_WORLD_SIZE" in os.environ else int(os.environ["WORLD_SIZE"])
        if self.options.nproc_per_node is not None:
            return self.options.nproc_per_node
        return torch.cuda.device_count() if self.use_cuda else CPU_WORKERS_WITHOUT_GPU

    def processes(self) -> int:
        if launched_externally():
            return int(os.environ["WORLD_SIZE"])
        return self.options.nnodes * self.nproc_per_node()

    def backend(self) -> str:
        backend = self.options.backend
        return ("nccl" if self.use_cuda else "gloo") if backend == "auto" else backend

    def describe(self) -> str:
        n = self.nproc_per_node()
        where = "GPUs, one per process" if self.use_cuda else (
            f"the CPU, {os.environ.get('OMP_NUM_THREADS', threads_per_worker(n))} thread(s) each")
        return (f"{self.processes()} process(es) ({self.options.nnodes} node(s) x {n}) on {where}, "
                f"backend {self.backend()}, started by torch's elastic agent")

    def validate(self) -> None:
        stall = self.trainer.stall_timeout
        if stall is not None and self.options.timeout <= stall:
            raise ConfigError(f"strategy.timeout={self.options.timeout:g} must be longer than trainer.stall_timeout="
                              f"{stall:g}: the stall watchdog names the stalled rank before the process group gives "
                              f"up; raise strategy.timeout (or lower trainer.stall_timeout)")
        if self.options.backend == "nccl" and not self.use_cuda:
            raise ConfigError("strategy.backend=nccl is not allowed without GPUs: nccl needs CUDA; use "
                              "strategy.backend=gloo (or auto) for CPU workers")
        if self.use_cuda and "nccl" in self.backend():
            self._validate_one_gpu_per_worker()

    def _validate_one_gpu_per_worker(self) -> None:
        """nccl refuses two ranks on one GPU ("Duplicate GPU detected"), and each worker takes GPU local_rank modulo
        the GPUs it sees. Under SLURM/submitit each task may see GPUs of its own (--gpus-per-task), so only torch's
        launchers, whose workers all see the node's GPUs, are counted here."""
        gpus = torch.cuda.device_count()
        if not launched_externally():
            if self.nproc_per_node() > gpus:
                raise ConfigError(
                    f"strategy.nproc_per_node={self.nproc_per_node()} is not allowed with nccl: this machine has "
                    f"{gpus} GPU(s) and nccl needs one GPU per worker; use at most {gpus}, or strategy.backend=gloo")
        elif scheduler_name() is None and self.nproc_per_node() > gpus:
            raise ConfigError(
                f"strategy={self.name} with nccl is not allowed with {self.nproc_per_node()} workers on this node: the "
                f"launcher started them (LOCAL_WORLD_SIZE={self.nproc_per_node()}) and the node shows each of them "
                f"{gpus} GPU(s), so two workers would share a GPU, which nccl refuses; start at most {gpus} per node "
                "(torchrun --nproc-per-node), or use strategy.backend=gloo")

    def launch(self, entry, payload):
        o = self.options
        if o.nproc_per_node is None and not self.use_cuda:
            print(f"strategy={self.name}: no GPU in use, so {CPU_WORKERS_WITHOUT_GPU} CPU workers on gloo "
                  "(set strategy.nproc_per_node to change)", flush=True)
        return launch_elastic(
            entry, payload, nproc_per_node=self.nproc_per_node(), nnodes=o.nnodes, rdzv_backend=o.rdzv_backend,
            rdzv_endpoint=o.rdzv_endpoint, node_rank=o.node_rank, max_restarts=o.max_restarts, run_id=o.run_id,
            log_all_ranks=self.trainer.log_all_ranks,
            log_dir=os.path.join(payload.run_dir, "worker_logs"),
        )

    # ---- joining -----------------------------------------------------------------------------
    def setup(self) -> None:
        self.rank = int(os.environ["RANK"])
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        if self.use_cuda:
            torch.cuda.set_device(self.local_rank % torch.cuda.device_count())
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", threads_per_worker(local_world))))
        if not dist.is_initialized():
            dist.init_process_group(
                self.backend(), store=launch_store(self.rank, self.world_size), rank=self.rank,
                world_size=self.world_size, timeout=datetime.timedelta(seconds=self.options.timeout),
                device_id=self.device if self.device.type == "cuda" else None,
            )

    def leave_group(self, wait_for_peers: bool) -> None:
        """With wait_for_peers, only once every rank got here (rank 0's store outlives the others). With nccl, one
        rank waiting for a peer that already left hangs until the group's timeout."""
        if dist.is_initialized():
            if wait_for_peers:
                dist.barrier()
            dist.destroy_process_group()

    def teardown(self) -> None:
        finished = sys.exc_info()[0] is None  # called from worker_entry's finally: no exception in flight
        self.leave_group(wait_for_peers=finished)
        if finished:
            exit_at_end_of_finished_worker()

    # ---- collectives -------------------------------------------------------------------------
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
        with self.clock.blocking() if self.clock else contextlib.nullcontext():
            dist.barrier()

    @contextlib.contextmanager
    def _released_after_backward(self):
        yield
        self.clock.stop()  # backward() has returned: every gradient's reduction is done


class DDPStrategy(ElasticStrategy):
    Options = DDPOptions
    options: DDPOptions

    def wrap(self, model: nn.Module, make_optimizer) -> Wrapped:
        o = self.options
        if o.sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        ddp = nn.parallel.DistributedDataParallel(
            model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
            find_unused_parameters=o.find_unused_parameters, bucket_cap_mb=o.bucket_cap_mb,
            gradient_as_bucket_view=o.gradient_as_bucket_view, static_graph=o.static_graph,
        )
        self.clock = WaitClock(self.device)
        ddp.register_comm_hook(self.clock, _timed_allreduce)
        return Wrapped(ddp, make_optimizer(ddp.parameters()), Precision(self.trainer.precision, self.device), self.clock)

    def eval_model(self, model: nn.Module) -> nn.Module:
        # Ranks may hold different numbers of test batches; DDP's forward would wait on a buffer broadcast.
        return self.unwrap(model)

    def sync(self, model: nn.Module, on: bool):
        return self._released_after_backward() if on else model.no_sync()
