"""Training time lost per checkpoint, blocking (trainer.async_checkpoint=false) against written behind the loop
(true): train.py experiment=char_lm (block 64) under ddp (single-file checkpoints) and fsdp (DCP shards), 2 workers, a
checkpoint every --every steps, and the same run without checkpoints, alternating (none, sync, async, none, ...).

The window is the time between the progress lines of step --warmup-steps and of the last step (startup, warm-up and
the final evaluation excluded). A checkpoint step's progress line comes before its save, so the window holds the
saves of its first step and of every --every steps up to, not including, the last: (window - window without
checkpoints) / those saves is the training time each one costs. Behind the loop that is the staging copy and the
wait for the one before; the write itself overlaps the steps that follow.

    .venv/bin/python bench/async_checkpoint.py --repeats 3
"""
from __future__ import annotations

import argparse
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
        f"trainer.max_steps={total}", f"trainer.log_every_n_steps={args.every}",
        f"trainer.checkpoint_every_n_steps={args.every}", f"dataset.block_size={args.block_size}",
        "trainer.progress_bar=false", *VARIANTS[variant])
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    out = run_timed(train, cwd, commands.environment(max(1, commands.cpu_cores() // 2)), args.timeout).check()
    last = step_times(out.lines)[total]
    if any(t < last for t, line in out.lines if "test loss" in line):
        raise RuntimeError(f"an evaluation (an epoch end) fell inside the timed window of {' '.join(train[2:])}: "
                           "lower --warmup-steps/--steps or --block-size")
    return {"window_s": args.steps / steps_per_second(out.lines, args.warmup_steps, total)}


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
            lost_sync, lost_async = (sync - none) / saves, (behind - none) / saves
            results[strategy] = {"window_s": {"none": none, "sync": sync, "async": behind},
                                 "lost_per_checkpoint_s": {"sync": lost_sync, "async": lost_async},
                                 "async_over_sync": ratio(lost_async, lost_sync), "samples": samples}
            rows.append([strategy, f"{none:.2f} s", f"{sync:.2f} s", f"{behind:.2f} s", f"{lost_sync * 1000:.0f} ms",
                         f"{lost_async * 1000:.0f} ms", ratio(lost_async, lost_sync)])
    print()
    print_table(["strategy", "window, no checkpoints", "window, sync", "window, async", "lost per checkpoint, sync",
                 "lost per checkpoint, async", "async / sync"], rows)
    write_results("async_checkpoint", vars(args), results)


if __name__ == "__main__":
    main()
