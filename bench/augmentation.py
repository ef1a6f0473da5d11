"""Cost of batched on-device augmentation (dataset.augment: random crop with padding 4 + horizontal flip) on the
in-memory path: the same train.py run with and without it, side by side. CIFAR-shaped data (synthetic
3x32x32, so it runs without the CIFAR-10 files), CifarNet, one process. Steps/s between the progress line that
ends the warm-up and the last one (see overhead.py). Target: at most 10% slower per step on CPU.

    .venv/bin/python bench/augmentation.py --repeats 3
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.arguments import progress_window
from benchkit.progress_lines import steps_per_second
from benchkit.report import print_table, write_results
from benchkit.timed_process import run_timed

AUGMENT = "+dataset.augment={_target_: framework.data.augment.RandomCropFlip, padding: 4, flip: true}"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="rounds of without, with")
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--steps", type=int, default=200, help="timed steps after the warm-up")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args(argv)
    progress_window(p, args.warmup_steps, args.steps, args.log_every)
    return args


def side(args, total: int, workdir: Path, *extra: str):
    overrides = ["strategy=single", "model=cifar_net", "dataset=synthetic", "dataset.shape=[3,32,32]",
                 f"dataset.train_size={total * args.batch_size}", "dataset.test_size=512",
                 f"trainer.batch_size={args.batch_size}", f"trainer.max_steps={total}",
                 f"trainer.log_every_n_steps={args.log_every}", "optimizer=sgd", "lr_schedule=constant",
                 "trainer.accelerator=cpu", *extra]

    def measure() -> dict:
        cwd = Path(tempfile.mkdtemp(dir=workdir))
        out = run_timed(commands.train_py(*overrides), cwd, commands.environment(None), args.timeout).check()
        return {"steps_per_sec": steps_per_second(out.lines, args.warmup_steps, total)}
    return measure


def main() -> None:
    args = parse_args()
    total = args.warmup_steps + args.steps
    with tempfile.TemporaryDirectory(prefix="bench-augment-") as tmp:
        samples = alternate({"without": side(args, total, Path(tmp)), "with": side(args, total, Path(tmp), AUGMENT)},
                            args.repeats)
    plain, augmented = median_of(samples["without"], "steps_per_sec"), median_of(samples["with"], "steps_per_sec")
    print()
    print_table(["steps/s without", "steps/s with augmentation", "ratio (>= 0.90)"],
                [[plain, augmented, ratio(augmented, plain)]])
    write_results("augmentation", vars(args), {"without_steps_per_sec": plain, "with_steps_per_sec": augmented,
                                               "ratio": ratio(augmented, plain), "samples": samples})


if __name__ == "__main__":
    main()
