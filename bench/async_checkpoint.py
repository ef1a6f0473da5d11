"""Training time lost per checkpoint, blocking (trainer.async_checkpoint=false) against written behind the loop
(true): train.py experiment=char_lm (block 64) under ddp (single-file checkpoints) and fsdp (DCP shards), 2 workers, a
checkpoint every --every steps, and the same run without checkpoints, alternating (none, sync, async, none, ...).

Two measures, each run logging every step. The stall: how much longer the step after each checkpoint takes than
the median step of the same run's window (its progress line comes before its save, the next one after the save and
one step), the training time the loop itself spends on a checkpoint: the whole save when blocking; the staging copy
and the wait for the write before when behind it. The window: the time between the progress lines of step
--warmup-steps and of the last step (startup, warm-up and the final evaluation excluded), which holds the saves of
its first step and every --every steps up to, not including, the last; (window - window without checkpoints) / those
saves counts what a write behind the loop takes from the steps it overlaps too, but on a loaded machine its noise
is as large as a checkpoint.

    .venv/bin/python bench/async_checkpoint.py --repeats 3
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.arguments import names, progress_window
from benchkit.progress_lines import step_times, steps_per_second
from benchkit.report import print_table, write_results
from benchkit.timed_process import run_timed

STRATEGIES = ("ddp", "fsdp")
VARIANTS = {"none": ["trainer.keep_checkpoints=0"], "sync": ["trainer.async_checkpoint=false"],
            "async": ["trainer.async_checkpoint=true"]}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default=",".join(STRATEGIES), help="comma list of " + ", ".join(STRATEGIES))
    p.add_argument("--every", type=int, default=20, help="trainer.checkpoint_every_n_steps")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=60, help="timed steps (a multiple of --every)")
    p.add_argument("--block-size", type=int, default=64,
                   help="dataset.block_size (64: the text's first epoch holds 84 steps, so no epoch end, with its "
                        "evaluation and checkpoint, falls inside the window)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args(argv)
    names(p, "--strategies", args.strategies, STRATEGIES)
    progress_window(p, args.warmup_steps, args.steps, args.every)
    return args


def window_seconds(strategy: str, variant: str, args, scratch: Path) -> dict:
    total = args.warmup_steps + args.steps
    train = commands.train_py(
        "experiment=char_lm", f"strategy={strategy}", "strategy.nproc_per_node=2", "trainer.accelerator=cpu",
        f"trainer.max_steps={total}", "trainer.log_every_n_steps=1",
        f"trainer.checkpoint_every_n_steps={args.every}", f"dataset.block_size={args.block_size}",
        "trainer.progress_bar=false", *VARIANTS[variant])
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    out = run_timed(train, cwd, commands.environment(max(1, commands.cpu_cores() // 2)), args.timeout).check()
    times = step_times(out.lines)
    if any(t < times[total] for t, line in out.lines if "test loss" in line):
        raise RuntimeError(f"an evaluation (an epoch end) fell inside the timed window of {' '.join(train[2:])}: "
                           "lower --warmup-steps/--steps or --block-size")
    gaps = {step: times[step] - times[step - 1] for step in range(args.warmup_steps + 1, total + 1)}
    after_saves = [step + 1 for step in range(args.warmup_steps, total, args.every)]
    typical = statistics.median(gap for step, gap in gaps.items() if step not in after_saves)
    return {"window_s": args.steps / steps_per_second(out.lines, args.warmup_steps, total),
            "stall_s": statistics.mean(gaps[step] - typical for step in after_saves)}


def main() -> None:
    args = parse_args()
    saves = args.steps // args.every  # the warm-up's last step's, and every --every steps before the last
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-async-checkpoint-") as tmp:
        for strategy in args.strategies.split(","):
            print(f"{strategy}: 2 workers, char LM, a checkpoint every {args.every} steps, {args.warmup_steps} warm-up "
                  f"+ {args.steps} timed steps ({saves} checkpoints in the window)", flush=True)
            samples = alternate({variant: (lambda v=variant, s=strategy: window_seconds(s, v, args, Path(tmp)))
                                 for variant in VARIANTS}, args.repeats)
            none, sync, behind = (median_of(samples[v], "window_s") for v in VARIANTS)
            stall_none, stall_sync, stall_async = (median_of(samples[v], "stall_s") for v in VARIANTS)
            lost_sync, lost_async = (sync - none) / saves, (behind - none) / saves
            results[strategy] = {"window_s": {"none": none, "sync": sync, "async": behind},
                                 "stall_s": {"none": stall_none, "sync": stall_sync, "async": stall_async},
                                 "window_lost_per_checkpoint_s": {"sync": lost_sync, "async": lost_async},
                                 "stall_async_over_sync": ratio(stall_async, stall_sync), "samples": samples}
            rows.append([strategy, f"{stall_sync * 1000:.0f} ms", f"{stall_async * 1000:.0f} ms",
                         ratio(stall_async, stall_sync), f"{stall_none * 1000:.0f} ms", f"{none:.1f} s",
                         f"{sync:.1f} s", f"{behind:.1f} s"])
    print()
    print_table(["strategy", "stall per checkpoint, sync", "async", "async / sync", "same step, no checkpoints",
                 "window, no checkpoints", "window, sync", "window, async"], rows)
    write_results("async_checkpoint", vars(args), results)


if __name__ == "__main__":
    main()
