"""Overhead of train.py against hand-written loops doing the same work, on CPU.

single: `train.py strategy=single` vs bench/baselines/plain_loop.py (one process)
dp:     `train.py strategy=dp` vs the same plain loop (on CPU dp is one process; its replica is timed)
ddp:    `train.py strategy=ddp` (2 gloo workers) vs `torchrun bench/baselines/ddp_torchrun.py`
ddp_dataloader: the same two with the DataLoader input path on both sides (`dataset.in_memory=false` vs
        `ddp_torchrun.py --dataloader`: DataLoader + DistributedSampler over the same uint8 tensors)

Same model (LeNet), global batch, optimizer (Adam), data in memory and threads per process on both sides.
Both sides print a progress line every --log-every steps; steps/s = measured steps / time between the
progress line that ends the warm-up and the last one, stamped by this script as the lines arrive (so
startup, data loading and the warm-up are excluded, the framework's logging is included). A, B, A, B;
medians and the ratio framework / baseline (target >= 0.98).

--against DIR adds a third side in the same alternation: DIR's train.py (another checkout, e.g. `git worktree add
/tmp/before HEAD~3`), with the same overrides; the table then also shows this checkout / that one, the cost of a
change measured side by side.

    .venv/bin/python bench/overhead.py --repeats 3
    .venv/bin/python bench/overhead.py --repeats 5 --against /tmp/before
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.arguments import names, progress_window
from benchkit.progress_lines import steps_per_second
from benchkit.report import print_table, write_results
from benchkit.run_folder import only_run_folder, read_result
from benchkit.timed_process import run_timed

ONE_PROCESS = ("single", "dp")
MODES = (*ONE_PROCESS, "ddp", "ddp_dataloader")
TRAIN_SAMPLES = 60_000  # Fashion-MNIST's training split: the measured window must stay inside epoch 1


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="single,ddp", help="comma list of " + ", ".join(MODES))
    p.add_argument("--repeats", type=int, default=3, help="rounds of framework, baseline")
    p.add_argument("--warmup-steps", type=int, default=100, help="steps before timing starts (one log interval)")
    p.add_argument("--steps", type=int, default=300, help="timed steps after the warm-up")
    p.add_argument("--log-every", type=int, default=100, help="progress line every N steps, both sides "
                                                              "(train.py's default trainer.log_every_n_steps)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch")
    p.add_argument("--ddp-workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=None,
                   help="threads per process, both sides (default: all cores for single, cores / workers for ddp)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    p.add_argument("--against", type=Path, default=None,
                   help="another checkout whose train.py runs as a third side (e.g. the code before a change)")
    args = p.parse_args(argv)
    names(p, "--modes", args.modes, MODES)
    progress_window(p, args.warmup_steps, args.steps, args.log_every)
    if args.warmup_steps + args.steps > TRAIN_SAMPLES // args.batch_size:
        p.error("warm-up + steps must fit in one epoch (an epoch end evaluates, which is not training)")
    return args


def framework_side(mode: str, args, total: int, workers: int, threads: int, workdir: Path,
                   repo: Path = commands.REPO):
    overrides = [
        f"strategy={mode if mode in ONE_PROCESS else 'ddp'}", f"trainer.batch_size={args.batch_size}", f"trainer.max_steps={total}",
        f"trainer.log_every_n_steps={args.log_every}", "dataset.max_test_samples=1000", "model=lenet",
        "optimizer=adam", "lr_schedule=constant", "trainer.channels_last=false", "trainer.grad_clip=null",
        "dataset=fashion_mnist",
        "trainer.precision=fp32",
    ]
    if mode not in ONE_PROCESS:
        overrides.append(f"strategy.nproc_per_node={workers}")
    if mode == "ddp_dataloader":
        overrides.append("dataset.in_memory=false")

    def measure() -> dict:
        cwd = Path(tempfile.mkdtemp(dir=workdir))
        out = run_timed(commands.train_py(*overrides, repo=repo), cwd, commands.environment(threads),
                        args.timeout).check()
        result = read_result(only_run_folder(cwd))
        return {
            "steps_per_sec": steps_per_second(out.lines, args.warmup_steps, total),
            "self_reported_samples_per_sec": result["samples_per_sec"],
        }
    return measure


def baseline_side(mode: str, args, total: int, workers: int, threads: int, workdir: Path):
    script_args = [f"--batch-size={args.batch_size}", f"--steps={total}", f"--log-every={args.log_every}"]
    if mode == "ddp_dataloader":
        script_args.append("--dataloader")
    command = (commands.baseline("plain_loop.py", *script_args) if mode in ONE_PROCESS
               else commands.torchrun("ddp_torchrun.py", workers, *script_args))

    def measure() -> dict:
        out = run_timed(command, workdir, commands.environment(threads), args.timeout).check()
        return {"steps_per_sec": steps_per_second(out.lines, args.warmup_steps, total)}
    return measure


def main() -> None:
    args = parse_args()
    total = args.warmup_steps + args.steps
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        for mode in args.modes.split(","):
            workers = 1 if mode in ONE_PROCESS else args.ddp_workers
            threads = args.threads or max(1, commands.cpu_cores() // workers)
            print(f"{mode}: {workers} process(es) x {threads} thread(s), global batch {args.batch_size}, "
                  f"{args.warmup_steps} warm-up + {args.steps} timed steps", flush=True)
            sides = {
                "framework": framework_side(mode, args, total, workers, threads, Path(tmp)),
                "baseline": baseline_side(mode, args, total, workers, threads, Path(tmp)),
            }
            if args.against:
                sides["against"] = framework_side(mode, args, total, workers, threads, Path(tmp), args.against)
            samples = alternate(sides, args.repeats)
            fw, base = median_of(samples["framework"], "steps_per_sec"), median_of(samples["baseline"], "steps_per_sec")
            results[mode] = {
                "processes": workers, "threads_per_process": threads,
                "framework_steps_per_sec": fw, "baseline_steps_per_sec": base, "ratio": ratio(fw, base),
                "framework_self_reported_samples_per_sec": median_of(samples["framework"], "self_reported_samples_per_sec"),
                "samples": samples,
            }
            row = [mode, f"{workers} x {threads}", fw, base, ratio(fw, base)]
            if args.against:
                other = median_of(samples["against"], "steps_per_sec")
                results[mode].update(against=str(args.against), against_steps_per_sec=other,
                                     ratio_to_against=ratio(fw, other))
                row += [other, ratio(fw, other)]
            rows.append(row)
    print()
    header = ["mode", "procs x threads", "train.py steps/s", "hand-written steps/s", "ratio (>= 0.98)"]
    if args.against:
        header += [f"{args.against.name} steps/s", "ratio to it"]
    print_table(header, rows)
    # the default modes keep their file; other selections get their own, so one run never overwrites another's
    name = "overhead" if args.modes == "single,ddp" else "overhead_" + args.modes.replace(",", "_")
    write_results(name + ("_against" if args.against else ""), {**vars(args), "against": str(args.against)}, results)


if __name__ == "__main__":
    main()
