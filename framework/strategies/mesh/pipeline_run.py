"""Pipeline parallel in the one loop: the loop's micro-batch, cut into strategy.microbatches pipeline micro-batches,
goes through a torch.distributed.pipelining schedule (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble,
ZBVZeroBubble), which runs the stages' forwards and backwards; on the last stage the run's own step turns each
micro-batch's output into per-sample losses (the step is handed a stand-in model that returns the pipeline's output),
whose mean is what backward starts from. Every rank then gets the per-sample losses (the loss is reported on every
rank). Evaluation's batches vary in size, which the schedule's fixed buffers do not take, so it runs the stages one
after another, forward only, and every rank gets the outputs."""
from __future__ import annotations

import functools
import time

import torch
import torch.distributed as dist
from torch import nn

from framework.config.strategy_options import MULTI_STAGE, MeshOptions
from framework.data.batches import batch_size, tree_map
from framework.data.build import is_pair
from framework.strategies.mesh import p2p
from framework.telemetry.pipeline_clock import Link, PipelineClock
from framework.training.metrics import per_sample_losses
from framework.training.engine import ProcessGroup, Weighting, Wrapped
from framework.training.step import StepOutput


@functools.cache
def _pipelining():
    """torch's schedules by name and TimedStage, made at a pipeline rank's first use: torch.distributed.pipelining
    imports torch._dynamo (about 2 s on 2 cores), which the driver of every mesh preset (ddp, fsdp) would otherwise
    pay while it checks the run, before the workers' template starts (tests/runs/test_startup_imports.py)."""
    # slow package: only a rank that runs pipeline stages imports it
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)

    def timed(span: str, method):
        def run(self, *args, **kwargs):
            with self.clock.span(span):
                return method(self, *args, **kwargs)
        return run

    class TimedStage(PipelineStage):
        """A PipelineStage whose compute, received messages (by the pipeline rank they come from), gradient
        reduction (FSDP2's reduce-scatter after the last micro-batch's backward) and first-step shape inference the
        clock counts, so that none of them is taken for bubble."""

        def __init__(self, *args, clock: PipelineClock, holders: list[int], **kwargs):
            super().__init__(*args, **kwargs)
            self.clock, self.holders = clock, holders

        forward_one_chunk = timed("forward", PipelineStage.forward_one_chunk)
        backward_one_chunk = timed("backward", PipelineStage.backward_one_chunk)
        backward_weight_one_chunk = timed("backward", PipelineStage.backward_weight_one_chunk)  # zero-bubble schedules
        perform_reduce_grad = timed("reduce", PipelineStage.perform_reduce_grad)
        # The schedule's first step infers each stage's shapes (a forward and a backward on meta tensors, and the
        # shapes sent between stages), in these two methods of PipelineStage: torch has no public hook around them.
        _prepare_forward_infra = timed("inference", PipelineStage._prepare_forward_infra)
        _prepare_backward_infra = timed("inference", PipelineStage._prepare_backward_infra)

        def get_fwd_recv_ops(self, fwd_chunk_id: int):
            ops = super().get_fwd_recv_ops(fwd_chunk_id)
            if not self.is_first:
                self.clock.received_from(self.holders[self.stage_index - 1], [op.tensor for op in ops])
            return ops

        def get_bwd_recv_ops(self, bwd_chunk_id: int):
            ops = super().get_bwd_recv_ops(bwd_chunk_id)
            if not self.is_last:
                self.clock.received_from(self.holders[self.stage_index + 1], [op.tensor for op in ops])
            return ops

    schedules = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B, "Interleaved1F1B": ScheduleInterleaved1F1B,
                 "InterleavedZeroBubble": ScheduleInterleavedZeroBubble, "ZBVZeroBubble": ScheduleZBVZeroBubble}
    return schedules, TimedStage


class StandIn:
    """What the step calls as the model on the last stage: the pipeline's output for this micro-batch's inputs."""

    def __init__(self, inputs, output):
        self.inputs, self.output, self.calls = inputs, output, 0

    def __call__(self, inputs):
        self.calls += 1
        if inputs is not self.inputs or self.calls > 1:
            raise RuntimeError("under pipeline parallel the step must call the model once, on the batch's inputs (the "
                               "first stage runs on them); this step called it otherwise (docs/model-parallel.md)")
        return self.output


def inputs_of(batch):
    """What the first stage runs on: the inputs of (inputs, targets), or the batch when samples are inputs only."""
    return batch[0] if is_pair(batch) else batch


class PipelineRunner:
    def __init__(self, stages: dict[int, nn.Module], holders: list[int], options: MeshOptions, pp_rank: int, pp_group,
                 device: torch.device, *, precision):
        """stages: this rank's stage modules by stage index; holders: the pipeline rank of every stage; options: the
        mesh's schedule and pipeline_microbatches."""
        schedule, microbatches = options.schedule, options.pipeline_microbatches
        self.stage_modules, self.num_stages, self.holders = stages, len(holders), holders
        self.pp_rank, self.group, self.device, self.precision = pp_rank, pp_group, device, precision
        self.last_rank = holders[-1]  # the rank computing the loss (rank 0 for ZBVZeroBubble's V)
        self.microbatches = microbatches
        self.clock = PipelineClock(device)
        self.schedule_name = schedule
        self.staged()
        self.holds_last = self.num_stages - 1 in stages
        self.current = None
        self.indices = [torch.tensor(i) for i in range(microbatches)]  # each micro-batch's "target": its index
        self.counts_tokens: bool | None = None  # whether the step counts tokens (known after the first step)

    def staged(self, shapes: dict[int, tuple] | None = None) -> None:
        """This rank's PipelineStages and their schedule. shapes: each stage's (input, output) examples, given to
        its PipelineStage instead of inferred by messages between the ranks (the planner's fake process group,
        framework/plan/pipeline.py, carries none)."""
        schedules, TimedStage = _pipelining()
        shapes = shapes or {}
        self.stages = [TimedStage(module, index, self.num_stages, self.device, *shapes.get(index, ()),
                                  group=self.group, clock=self.clock, holders=self.holders)
                       for index, module in sorted(self.stage_modules.items())]
        # scale_grads=False: the loss handed back is already each micro-batch's share of the step's mean
        self.schedule = schedules[self.schedule_name](
            self.stages if self.schedule_name in MULTI_STAGE else self.stages[0], n_microbatches=self.microbatches,
            loss_fn=self._loss, scale_grads=False)

    # ---- training -------------------------------------------------------------------------------------------
    def forward_backward(self, step, batch, loss, weighting: Weighting) -> StepOutput:
        m = self.microbatches
        chunks = split(batch, m)
        self.current = {"step": step, "loss": loss, "chunks": chunks, "weighting": weighting, "losses": [None] * m,
                        "tokens": [None] * m}
        with self.clock.span("schedule"):
            with self.precision.autocast():
                # return_outputs=False: the last stage would keep every micro-batch's output (an LM's logits) and
                # return a concatenated copy, held until the next step; the step's loss_fn has read them already
                self.schedule.step(arg_mbs=[(inputs_of(c),) for c in chunks], kwarg_mbs=[{} for _ in chunks],
                                   target_mbs=self.indices, return_outputs=False)
            # the stages meet here: a stage done early waits for the drain of the others, inside its span
            losses, tokens = self._shared_losses(batch_size(batch))
        self.current = None
        return StepOutput(losses, None, None, len(losses), tokens)

    def _loss(self, output, target: torch.Tensor) -> torch.Tensor:
        """The schedule's loss_fn on the last stage, for one pipeline micro-batch (its target is its index, a CPU
        tensor: reading it costs no device sync)."""
        c = self.current
        index = int(target)
        chunk = c["chunks"][index]
        with self.clock.span("forward"):
            out = c["step"](StandIn(inputs_of(chunk), output), chunk, c["loss"])
            per_sample = per_sample_losses(out.loss, out.samples)
        c["losses"][index], c["tokens"][index] = per_sample.detach(), out.tokens
        return c["weighting"].objective(per_sample, self.microbatches)

    def _shared_losses(self, samples: int) -> tuple[torch.Tensor, object]:
        """The last stage's per-sample losses and token count, on every pipeline rank: an all-reduce (the others add
        zeros) rather than a broadcast, so that every stage waits until the last one is done (no host sync)."""
        c = self.current
        if self.holds_last:
            counted = [t for t in c["tokens"] if t is not None]
            tokens = sum(torch.as_tensor(t, dtype=torch.float64, device=self.device) for t in counted) if counted \
                else torch.zeros((), dtype=torch.float64, device=self.device)
            losses = torch.cat(c["losses"])
            packed = torch.cat([losses.double(), tokens.reshape(1)])
        else:
            packed = torch.zeros(samples + 1, dtype=torch.float64, device=self.device)
            losses = None
        if self.counts_tokens is None:  # once: whether the step counts tokens, which only the last stage sees
            flag = [bool(counted) if self.holds_last else None]
            dist.broadcast_object_list(flag, group=self.group, group_src=self.last_rank,
                                       device=self.device if self.device.type == "cuda" else None)
            self.counts_tokens = flag[0]
        dist.all_reduce(packed, group=self.group)
        if losses is None:
            losses = packed[:-1].float()
        return losses, (packed[-1] if self.counts_tokens else None)

    # ---- evaluation -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, inputs):
        """Forward only, one stage after another (no schedule): the last stage's output on every pipeline rank."""
        x, holders = inputs, self.holders
        with self.precision.autocast():
            for index in range(self.num_stages):
                if holders[index] != self.pp_rank:
                    continue
                if index > 0 and holders[index - 1] != self.pp_rank:
                    x = p2p.recv(holders[index - 1], self.group, self.device)
                x = self.stage_modules[index](x)
                if index < self.num_stages - 1 and holders[index + 1] != self.pp_rank:
                    p2p.send(x, holders[index + 1], self.group, self.device)
        return p2p.broadcast(x if self.holds_last else None, self.last_rank, self.group, self.device)

    # ---- the clock's links ------------------------------------------------------------------------------------
    def measure_links(self, sizes=(1 << 12, 1 << 22), rounds: int = 3) -> None:
        """Every pipeline rank, once: latency and bandwidth of each link between ranks holding neighbouring stages
        (a ping-pong of two message sizes, in the same order on every rank), for the clock's communication time."""
        pairs = sorted({tuple(sorted(p)) for p in zip(self.holders, self.holders[1:]) if p[0] != p[1]})
        links = {}
        for a, b in pairs:
            if self.pp_rank in (a, b):
                peer = b if self.pp_rank == a else a
                times = [_ping_pong(self.pp_rank == a, peer, size, rounds, self.group, self.device) for size in sizes]
                per_byte = max(0.0, (times[1] - times[0]) / (sizes[1] - sizes[0]))
                links[peer] = Link(max(0.0, times[0] - per_byte * sizes[0]), per_byte)
            dist.barrier(group=self.group)
        self.clock.links = links


def _ping_pong(first: bool, peer: int, size: int, rounds: int, group, device: torch.device) -> float:
    """Seconds one message of `size` bytes takes one way (the best of `rounds` round trips, halved)."""
    buffer = torch.zeros(size // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(rounds + 1):  # the first round warms the connection up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for send in ((True, False) if first else (False, True)):
            (dist.send if send else dist.recv)(buffer, group=group, **({"group_dst": peer} if send else
                                                                      {"group_src": peer}))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best / 2


def split(batch, m: int) -> list:
    """The batch cut into m equal pipeline micro-batches along its first dimension (every tensor of the nesting)."""
    step = batch_size(batch) // m
    return [tree_map(lambda t, i=i: t[i * step:(i + 1) * step], batch) for i in range(m)]


class Pipeline(nn.Module):
    """This rank's stages as one module: what the loop trains (train()/eval() reach every stage) and evaluates (its
    forward: the forward-only pass, the outputs on every rank). Training steps go through the schedule."""

    def __init__(self, runner: PipelineRunner):
        super().__init__()
        self.stages = nn.ModuleList(module for _, module in sorted(runner.stage_modules.items()))
        self.runner = runner

    def forward(self, inputs):
        return self.runner.forward(inputs)


class PipelineWrapped(Wrapped):
    """OwnsForwardBackward (the schedule runs the micro-batch's forwards and backwards) and OwnClock (each stage's
    compute, bubble and communication)."""

    def __init__(self, *args, runner: PipelineRunner, traffic=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.runner = runner
        self.traffic = traffic  # CountsTraffic: FSDP2's reduce-scatters, where they carry every gradient

    def forward_backward(self, step, batch, loss, weighting):
        return self.runner.forward_backward(step, batch, loss, weighting)

    def wait_clock(self, group: ProcessGroup | None = None):
        return self.runner.clock
