"""Strategy comparison on one config, on CPU: `train.py strategy=single`, `dp`, `ddp` (2 gloo workers), and
any strategy named with --strategies as it lands. Global and per-rank samples/s, read back from each
run's TensorBoard files (median over the logged intervals after the first, which holds the warm-up)
and its result.json (whole run, warm-up included). Threads are left to train.py (single and dp: torch's
default, every core; ddp: cores / workers per worker). Rounds alternate the strategies; medians, and
each strategy's speed-up over single (target: ddp with 2 workers >= 1.7x on a compute-bound model).
Every strategy trains in the default memory layout (trainer.channels_last=false: DeepSpeed cannot use
channels_last, and the comparison is of strategies, not layouts).

--batch-per-process makes --batch-size the batch of each process (weak scaling, as when a second GPU is
added and each GPU keeps its batch): multi-process strategies then train a global batch of batch x workers.
Without it the global batch is fixed and each of 2 workers gets half of it (strong scaling).

    .venv/bin/python bench/strategies.py --repeats 3
    .venv/bin/python bench/strategies.py --strategies ddp,horovod   # same 2 workers, horovod's runner and allreduce
    .venv/bin/python bench/strategies.py --strategies ddp,fsdp      # same 2 workers, FSDP2's gather/reduce-scatter
    .venv/bin/python bench/strategies.py --strategies single,single+trainer.compile=true   # a variant's own overrides

A variant NAME+KEY=VALUE[+KEY=VALUE...] adds train.py overrides to that variant alone; its speed-up over NAME (the same
variant without them, when it runs too) is a column of its own.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from statistics import median

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.arguments import config_options
from benchkit.report import print_table, write_results
from benchkit.run_folder import only_run_folder, read_result, steady_throughput, tensorboard_scalars
from benchkit.timed_process import run_timed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strategies", default="single@1,single,dp,ddp",
                   help="comma list; the first is the reference. NAME@T runs NAME with OMP_NUM_THREADS=T: "
                        "single@1 is one core, the per-device reference that ddp's 2 one-thread workers scale from; "
                        "deepspeed:N is strategy=deepspeed with strategy.zero_stage=N; NAME+KEY=VALUE adds an override "
                        "to that variant alone")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="lenet")
    p.add_argument("--batch-size", type=int, default=128, help="global batch")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--ddp-workers", type=int, default=2, help="workers of ddp, fsdp, deepspeed and horovod")
    p.add_argument("--batch-per-process", action="store_true",
                   help="--batch-size is per process: ddp, fsdp, deepspeed and horovod train batch x workers")
    p.add_argument("--override", action="append", default=[], help="extra train.py override (repeatable)")
    p.add_argument("--results-name", help="file name under bench/results/ (default: strategies[_batch_per_process])")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run")
    args = p.parse_args(argv)
    for variant in args.strategies.split(","):
        why = variant_error(variant)
        if why:
            p.error(f"--strategies={args.strategies}: {variant!r} {why}")
    return args


def variant_error(variant: str) -> str | None:
    """Why a --strategies entry (NAME[:ZERO_STAGE][@THREADS][+KEY=VALUE...]) cannot run, or None."""
    variant, *own_overrides = variant.split("+")
    strategy, _, threads = variant.partition("@")
    strategy, _, zero_stage = strategy.partition(":")
    if strategy not in config_options("strategy"):
        return f"names no strategy (conf/strategy/: {', '.join(config_options('strategy'))})"
    if zero_stage and (strategy != "deepspeed" or zero_stage not in ("0", "1", "2", "3")):
        return "has a ZeRO stage: deepspeed:N with N 0 to 3 only"
    if threads and not (threads.isdigit() and int(threads) > 0):
        return "has @THREADS that is not a positive number"
    if any("=" not in override for override in own_overrides):
        return "has a +override without KEY=VALUE"
    return None


def train_commands(args) -> list[list[str]]:
    """The train.py overrides of each --strategies entry, in order (tests/unit/test_bench_readme.py composes them)."""
    return [train_overrides(variant, args) for variant in args.strategies.split(",")]


def train_overrides(variant: str, args) -> list[str]:
    variant, *own_overrides = variant.split("+")
    strategy = variant.partition("@")[0]
    strategy, _, zero_stage = strategy.partition(":")  # deepspeed:2 is strategy=deepspeed strategy.zero_stage=2
    multi_process = strategy in ("ddp", "fsdp", "deepspeed", "horovod")
    batch = args.batch_size * args.ddp_workers if args.batch_per_process and multi_process else args.batch_size
    overrides = [
        f"strategy={strategy}", *([f"strategy.zero_stage={zero_stage}"] if zero_stage else []),
        f"model={args.model}", f"trainer.batch_size={batch}", "trainer.channels_last=false",
        f"trainer.max_steps={args.steps}", f"trainer.log_every_n_steps={args.log_every}",
        "dataset.max_test_samples=1000", *args.override, *own_overrides,
    ]
    if strategy in ("ddp", "fsdp", "deepspeed"):
        overrides.append(f"strategy.nproc_per_node={args.ddp_workers}")
    if strategy == "horovod":  # same workers as ddp, started by horovod's runner
        overrides.append(f"strategy.np={args.ddp_workers}")
    return overrides


def run_strategy(variant: str, args, workdir: Path):
    overrides = train_overrides(variant, args)
    threads = variant.split("+")[0].partition("@")[2]

    def measure() -> dict:
        cwd = Path(tempfile.mkdtemp(dir=workdir))
        env = commands.environment(int(threads) if threads else None)
        run_timed(commands.train_py(*overrides), cwd, env, args.timeout).check()
        run_folder = only_run_folder(cwd)
        result = read_result(run_folder)
        steady = steady_throughput(tensorboard_scalars(run_folder))
        return {
            "samples_per_sec": steady["samples_per_sec"],
            "per_rank_samples_per_sec": steady["per_rank_samples_per_sec"],
            "result_json_samples_per_sec": result["samples_per_sec"],
            "result_json_per_rank_samples_per_sec": result["per_rank_samples_per_sec"],
            "processes": result["processes"],
        }
    return measure


def per_rank_medians(samples: list[dict], key: str) -> list[float]:
    return [median(rank_values) for rank_values in zip(*(s[key] for s in samples))]


def main() -> None:
    args = parse_args()
    names = args.strategies.split(",")
    batch = f"batch {args.batch_size} per process" if args.batch_per_process else f"global batch {args.batch_size}"
    print(f"model={args.model}, {batch}, {args.steps} steps per run, "
          f"log every {args.log_every}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-strategies-") as tmp:
        samples = alternate({name: run_strategy(name, args, Path(tmp)) for name in names}, args.repeats)
    reference = median_of(samples[names[0]], "samples_per_sec")
    results, rows = {}, []
    for name in names:
        rate = median_of(samples[name], "samples_per_sec")
        per_rank = per_rank_medians(samples[name], "per_rank_samples_per_sec")
        results[name] = {
            "samples_per_sec": rate, "per_rank_samples_per_sec": per_rank,
            "result_json_samples_per_sec": median_of(samples[name], "result_json_samples_per_sec"),
            f"speedup_over_{names[0]}": ratio(rate, reference), "samples": samples[name],
        }
        base = name.split("+")[0]
        over_base = ratio(rate, median_of(samples[base], "samples_per_sec")) if base != name and base in samples else None
        if over_base is not None:
            results[name][f"speedup_over_{base}"] = over_base
        rows.append([name, samples[name][0]["processes"], rate, ", ".join(f"{r:,.0f}" for r in per_rank),
                     results[name]["result_json_samples_per_sec"], ratio(rate, reference), over_base])
    print()
    print_table(["strategy", "processes", "samples/s (steady)", "per rank", "samples/s (result.json)",
                 f"x {names[0]}", "x without its +overrides"], rows)
    write_results(args.results_name or ("strategies_batch_per_process" if args.batch_per_process else "strategies"),
                  vars(args), results)


if __name__ == "__main__":
    main()
