"""Bench-only: one rank of a configuration on real tensors in a real gloo group, built as a worker builds it
(framework/assemble.py: build_task, the strategy's own parallelize) and stepped twice as the loop steps; prints its
peak of tensor bytes during the two steps (the plan's peak: parallelize's own is before) as
`allocator peak rank R: BYTES`. The reference plan.py is checked against
(bench/plan.py): the CPU allocator's own events as torch.profiler records them (profile_memory=True: one event per
allocation and free, with its bytes), summed in time order over a window in which every tensor the steps hold is
made (a copy of the built model, the batch, parallelize, the steps). No dispatch mode and no fake tensor:
independent of the plan's count. (torch.profiler's memory timeline analysis is not used: it fails on DTensor's autograd graph.)

    python bench/probes/allocator_peak.py WORLD RANK PORT [--config-dir DIR] [train.py overrides]   # per rank"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the framework this checkout holds
from framework.assemble import RunContext, build_task, parallelize, seed_everything  # noqa: E402
from framework.config.settings import settings_of  # noqa: E402
from framework.config.targets import TargetAllowlist, allowing  # noqa: E402
from framework.common.paths import overrides_and_config_dir  # noqa: E402
from framework.plan.batch import first_batch  # noqa: E402
from framework.plan.command import composed_runs  # noqa: E402
from framework.session.environment import TORCH, Ranks  # noqa: E402
from framework.strategies import choose_strategy  # noqa: E402
from framework.training.engine import Weighting, forward_backward, gradient_sync  # noqa: E402

STEPS = "allocator_peak.steps"


def two_steps(wrapped, task, batch, t) -> None:
    for _ in range(2):
        wrapped.optimizer.zero_grad(set_to_none=True)
        for micro in range(t.grad_accum):
            with gradient_sync(wrapped, on=micro == t.grad_accum - 1):
                forward_backward(wrapped, task.step, batch, task.loss, Weighting(t.grad_accum))
        wrapped.precision.optimizer_step(wrapped.model, wrapped.optimizer, t.grad_clip, False)


def main() -> None:
    world, rank, port = (int(a) for a in sys.argv[1:4])
    overrides, config_dir = overrides_and_config_dir(sys.argv[4:], "allocator_peak.py")
    cfg = next(composed_runs([*overrides, "trainer.accelerator=cpu", "trainer.channels_last=false"], config_dir))
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        with allowing(TargetAllowlist.of_command(cfg)):
            strategy_class, _ = choose_strategy(cfg, None)
            s = settings_of(cfg, strategy_class.Options)
            strategy = strategy_class(s.strategy, s.trainer.engine(), ranks=Ranks(TORCH, rank, rank, world, world))
            group = strategy.join()
            seed_everything(s.trainer.seed)
            built = build_task(s, torch.device("cpu"), "measured on the CPU")
            t = s.trainer
            ctx = RunContext(settings=s, strategy=strategy, group=group, ranks=None, run_dir=None, say=print,
                             stop=None)
            # every tensor the steps hold is made in the window, from a copy of the model and a batch taken there:
            # torch.profiler reports no free of a block allocated before it started
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
                task = dataclasses.replace(built, model=copy.deepcopy(built.model))
                batch = first_batch(task.data, t.batch_size // (group.dp_size * t.grad_accum))
                wrapped = parallelize(ctx, task)
                with record_function(STEPS):
                    two_steps(wrapped, task, batch, t)
        events = profiler.profiler.kineto_results.events()
        steps_start = next(e.start_ns() for e in events if e.name() == STEPS)
        now = peak = 0
        for at, nbytes in sorted((e.start_ns(), e.nbytes()) for e in events
                                 if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU):
            now += nbytes
            if at >= steps_start:
                peak = max(peak, now)
        print(f"allocator peak rank {rank}: {peak}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
