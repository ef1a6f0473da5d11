"""trainer.activation_checkpointing (framework/training/speedups.py) on CPU: time per training step and peak memory
of experiment=char_lm's GPT with and without each block's activations recomputed in backward. Each measurement is a
fresh process (python's peak RSS only grows): its RSS before the first step, then --warmup-steps and --steps
training steps (forward, per-token cross-entropy, backward, AdamW step) on random tokens; the memory a step needs is
the peak RSS over those steps less the RSS before them (activations, gradients, optimizer state, allocator slack).
Rounds alternate the variants; medians, and the ratios over the plain model.

    .venv/bin/python bench/activation_checkpointing.py --repeats 3
    .venv/bin/python bench/activation_checkpointing.py --batch-size 128 --n-layer 8
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from statistics import median

import torch
import torch.nn.functional as F

from benchkit.alternation import alternate, median_of, ratio
from benchkit.report import print_table, write_results
from framework.models.blocks import auto_units
from framework.models.gpt import GPT
from framework.training.speedups import apply_speedups

VARIANTS = ("plain", "activation_checkpointing")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64, help="experiment=char_lm's batch")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocabulary", type=int, default=96)
    p.add_argument("--steps", type=int, default=20, help="timed steps per process")
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def measure_here(args) -> dict:
    """One variant in this process: median seconds per step and the peak RSS the steps added."""
    torch.manual_seed(0)
    model = GPT((args.block_size,), args.vocabulary, n_layer=args.n_layer, n_head=4, n_embd=args.n_embd)
    if args.child == "activation_checkpointing":
        apply_speedups(model, False, torch.device("cpu"), checkpointed=auto_units(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, args.vocabulary, (args.batch_size, args.block_size + 1))
    before = rss_mib()
    times = []
    for step in range(args.warmup_steps + args.steps):
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"ms_per_step": 1000 * median(times[args.warmup_steps:]), "peak_step_mib": peak - before,
            "rss_before_mib": before}


def in_a_process(variant: str):
    def measure() -> dict:
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", variant], check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    return measure


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(measure_here(args)))
        return
    print(f"GPT n_layer={args.n_layer} n_embd={args.n_embd} block {args.block_size}, batch {args.batch_size}, "
          f"{torch.get_num_threads()} threads", flush=True)
    samples = alternate({name: in_a_process(name) for name in VARIANTS}, args.repeats)
    plain_ms, plain_mib = median_of(samples["plain"], "ms_per_step"), median_of(samples["plain"], "peak_step_mib")
    results, rows = {}, []
    for name in VARIANTS:
        ms, mib = median_of(samples[name], "ms_per_step"), median_of(samples[name], "peak_step_mib")
        results[name] = {"ms_per_step": ms, "peak_step_mib": mib, "time_over_plain": ratio(ms, plain_ms),
                         "memory_over_plain": ratio(mib, plain_mib), "samples": samples[name]}
        rows.append([name, ms, ratio(ms, plain_ms), mib, ratio(mib, plain_mib)])
    print()
    print_table(["variant", "ms/step", "time x plain", "peak MiB added by the steps", "memory x plain"], rows)
    write_results("activation_checkpointing", {k: v for k, v in vars(args).items() if k != "child"}, results)


if __name__ == "__main__":
    main()
