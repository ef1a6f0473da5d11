"""Model parallel on CPU workers (gloo): per-rank bytes of parameters + optimizer state, step time, and each pipeline
schedule's measured bubble against its theory, for experiment=char_lm's GPT made larger (8 layers x 256, 8 heads,
block 64). Variants: single and ddp (2 workers: whole model on each), dp_shard=2 (the mesh's FSDP2), tp=2,
pp=2 with GPipe, 1F1B, Interleaved1F1B (2 stages per rank) and the zero-bubble InterleavedZeroBubble and ZBVZeroBubble
(2 stages per rank, each backward split into input and weight gradients). Rounds alternate the variants; medians.

- bytes: each rank's parameters and AdamW state at the end of training (a DTensor by its local shard), written by
  bench/probes/parameter_bytes.py, a callback of the run; the ratio is the largest rank's over single's.
- step time: median of time/step_ms over the logged steps after the first --warmup-steps.
- bubble: per pipeline rank, time/wait_ms / (forward + backward + wait + comm) per step, the share of the
  schedule's wall time the stage waited for a neighbour (framework/telemetry/pipeline_clock.py); the theory is
  (p-1)/(m+p-1) for GPipe and 1F1B and (p-1)/(v m+p-1) for Interleaved1F1B (v stages per rank), equal stages. The
  zero-bubble schedules' bubble depends on how long the weight gradients take against the rest of backward (the
  work they move into the bubble), so no single number is their theory: the table shows theirs beside the others.
  On 2 cores the stages also compete for the CPU (a stage computing alone, in the fill and drain, runs faster than
  two at once); --sleepy trains a model whose blocks take fixed times, which measures the clock alone.

    .venv/bin/python bench/model_parallel.py --repeats 2
    .venv/bin/python bench/model_parallel.py --variants pp2_GPipe,pp2_1F1B --microbatches 8
    .venv/bin/python bench/model_parallel.py --variants pp2_GPipe,pp2_1F1B,pp2_Interleaved1F1B --sleepy 20,40 \
        --results-name model_parallel_sleepy
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from statistics import median

from benchkit import commands
from benchkit.alternation import alternate, median_of
from benchkit.arguments import names
from benchkit.report import print_table, write_results
from benchkit.run_folder import only_run_folder, read_result, tensorboard_scalars
from benchkit.timed_process import run_timed

PROBES = commands.REPO / "bench" / "probes"
VARIANTS = {
    "single": ["strategy=single"],
    "ddp": ["strategy=ddp", "strategy.nproc_per_node=2"],
    "dp_shard2": ["strategy=tp", "strategy.tp=1", "strategy.dp_shard=2"],
    "tp2": ["strategy=tp", "strategy.tp=2"],
    "pp2_GPipe": ["strategy=pp", "strategy.schedule=GPipe"],
    "pp2_1F1B": ["strategy=pp", "strategy.schedule=1F1B"],
    "pp2_Interleaved1F1B": ["strategy=pp", "strategy.schedule=Interleaved1F1B", "strategy.stages_per_rank=2"],
    "pp2_InterleavedZeroBubble": ["strategy=pp", "strategy.schedule=InterleavedZeroBubble", "strategy.stages_per_rank=2"],
    "pp2_ZBVZeroBubble": ["strategy=pp", "strategy.schedule=ZBVZeroBubble"],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline micro-batches per step")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--sleepy", metavar="FWD_MS,BWD_MS",
                   help="train bench/probes/sleepy.py's model instead, whose blocks sleep this long in forward and "
                        "backward (each pipeline micro-batch): the bubble without stages competing for the CPU")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--results-name", default="model_parallel", help="file name under bench/results/")
    args = p.parse_args(argv)
    names(p, "--variants", args.variants, VARIANTS)
    if not 0 <= args.warmup_steps < args.steps:
        p.error(f"--warmup-steps={args.warmup_steps} must be below --steps={args.steps}: step times and bubbles are "
                "medians over the steps after the warm-up")
    if args.sleepy is not None and not _two_numbers(args.sleepy):
        p.error(f"--sleepy={args.sleepy}: two numbers of milliseconds, FWD_MS,BWD_MS (e.g. 20,40)")
    planned = [name for name in args.variants.split(",") if "strategy.tp=2" in VARIANTS[name]]
    if args.sleepy is not None and planned:
        p.error(f"--sleepy with --variants={args.variants}: {', '.join(planned)} cannot split the sleepy model (it has "
                "no tensor_parallel_plan); name the pipeline variants, e.g. --variants pp2_GPipe,pp2_1F1B")
    return args


def _two_numbers(text: str) -> bool:
    try:
        return len([float(part) for part in text.split(",")]) == 2
    except ValueError:
        return False


def run_variant(name: str, args, workdir: Path):
    pipelined = name.startswith("pp")
    overrides = [
        "experiment=char_lm", f"model.n_layer={args.n_layer}", f"model.n_embd={args.n_embd}",
        f"model.n_head={args.n_head}", f"dataset.block_size={args.block_size}", f"trainer.batch_size={args.batch_size}",
        f"trainer.max_steps={args.steps}", "trainer.log_every_n_steps=1", "trainer.keep_checkpoints=0",
        "lr_schedule=constant", "dataset.max_test_samples=64", "trainer.progress_bar=false",
        "+callbacks.bytes._target_=parameter_bytes.ParameterBytes",
        *VARIANTS[name], *([f"strategy.microbatches={args.microbatches}"] if pipelined else []),
    ]
    if args.sleepy:  # a model of fixed block times; the settings above that name the GPT's shape no longer apply
        forward_ms, backward_ms = args.sleepy.split(",")
        overrides = [o for o in overrides if not o.startswith("model.")] + [
            "~model.n_layer", "~model.n_head", "~model.n_embd", "~model.dropout", "model._target_=sleepy.SleepyLM",
            f"+model.layers={args.n_layer}", f"+model.forward_ms={forward_ms}", f"+model.backward_ms={backward_ms}"]

    def measure() -> dict:
        cwd = Path(tempfile.mkdtemp(dir=workdir))
        env = commands.environment(None)
        env["PYTHONPATH"] = str(PROBES)
        env["PARAMETER_BYTES_DIR"] = str(cwd / "bytes")
        run_timed(commands.train_py(*overrides), cwd, env, args.timeout).check()
        run_folder = only_run_folder(cwd)
        scalars = tensorboard_scalars(run_folder)
        processes = read_result(run_folder)["processes"]
        ranks = [json.loads((cwd / "bytes" / f"rank{r}.json").read_text()) for r in range(processes)]
        sample = {
            "processes": processes,
            "bytes_per_rank": [r["parameters"] + r["optimizer_state"] for r in ranks],
            "parameter_bytes_per_rank": [r["parameters"] for r in ranks],
            "optimizer_bytes_per_rank": [r["optimizer_state"] for r in ranks],
            "step_ms": _steady(scalars, "time/step_ms", args.warmup_steps),
        }
        if pipelined:
            sample["bubble_per_rank"] = [_bubble(scalars, r, args.warmup_steps) for r in range(processes)]
            sample["comm_ms_per_rank"] = [_steady(scalars, f"time/comm_ms/rank{r}", args.warmup_steps)
                                          for r in range(processes)]
            sample["bubble"] = sum(sample["bubble_per_rank"]) / processes
        return sample
    return measure


def _values(scalars, tag: str, warmup: int) -> list[float]:
    return [v for step, v in scalars[tag] if step > warmup]


def _steady(scalars, tag: str, warmup: int) -> float:
    return median(_values(scalars, tag, warmup))


def _bubble(scalars, rank: int, warmup: int) -> float:
    """The median over steps of this stage's wait / (compute + wait + comm) within the schedule."""
    parts = [_values(scalars, f"time/{kind}_ms/rank{rank}", warmup) for kind in ("wait", "forward", "backward", "comm")]
    return median(w / (w + f + b + c) for w, f, b, c in zip(*parts))


def theory(name: str, microbatches: int, pp: int = 2) -> float | None:
    if not name.startswith("pp") or "ZeroBubble" in name:
        return None
    v = 2 if name.endswith("Interleaved1F1B") else 1
    return (pp - 1) / (v * microbatches + pp - 1)


def main() -> None:
    args = parse_args()
    names = args.variants.split(",")
    print(f"GPT {args.n_layer} x {args.n_embd} ({args.n_head} heads), block {args.block_size}, global batch "
          f"{args.batch_size}, {args.steps} steps, pipeline micro-batches {args.microbatches}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-model-parallel-") as tmp:
        samples = alternate({name: run_variant(name, args, Path(tmp)) for name in names}, args.repeats)
    single = max(samples["single"][0]["bytes_per_rank"]) if "single" in samples else None
    results, rows = {}, []
    for name in names:
        first = samples[name][0]  # bytes do not vary between rounds
        largest = max(first["bytes_per_rank"])
        bubble, expected = median_of(samples[name], "bubble"), theory(name, args.microbatches)
        results[name] = {
            "bytes_per_rank": first["bytes_per_rank"], "parameter_bytes_per_rank": first["parameter_bytes_per_rank"],
            "optimizer_bytes_per_rank": first["optimizer_bytes_per_rank"],
            "largest_rank_over_single": largest / single if single else None,
            "step_ms": median_of(samples[name], "step_ms"), "bubble": bubble, "bubble_theory": expected,
            "samples": samples[name],
        }
        per_rank_bubble = ([median(r) for r in zip(*(s["bubble_per_rank"] for s in samples[name]))]
                           if name.startswith("pp") else [])
        rows.append([name, first["processes"], ", ".join(f"{b / 2**20:.1f}" for b in first["bytes_per_rank"]),
                     results[name]["largest_rank_over_single"], results[name]["step_ms"],
                     ", ".join(f"{b:.3f}" for b in per_rank_bubble) or None, expected,
                     (bubble - expected) / expected if expected else None])
    print()
    print_table(["variant", "ranks", "params+optimizer MiB per rank", "largest rank / single", "step ms (median)",
                 "bubble per rank", "bubble theory", "(measured - theory) / theory"], rows)
    write_results(args.results_name, vars(args), results)


if __name__ == "__main__":
    main()
