"""What trainer.invariant costs (issue 58): ms per training step of `train.py` with the world-size-invariant mode, under
each reducer (fixed_point, gathered), against the same run without it, for LeNet and experiment=char_lm (block 64),
on 1 process (strategy=single) and 2 gloo workers (strategy=ddp), 1 thread per process on every side; variants
alternate. Step time: the median of TensorBoard's time/step_ms over the log intervals after the first (warm-up).
Bytes per step and rank: what a rank hands to its collectives (the framework's traffic meters count the same way):
plain ddp 4 bytes a parameter (its fp32 all-reduce), fixed_point 8 (one int64 all-reduce) + 8 a tensor (the gathered
maxima), gathered 4 x K / W (its K/W shard gradients into the all-gather); one process sends nothing.

    .venv/bin/python bench/invariant.py --repeats 2 [--models lenet,char_lm] [--workers 1,2] [--shards 8]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from framework.results.trained_model import read_trained  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.alternation import alternate, median_of, ratio  # noqa: E402
from benchkit.arguments import names  # noqa: E402
from benchkit.commands import environment, train_py  # noqa: E402
from benchkit.report import print_table, write_results  # noqa: E402
from benchkit.run_folder import only_run_folder, tensorboard_scalars  # noqa: E402
from benchkit.timed_process import run_timed  # noqa: E402

MODELS = {
    "lenet": ["model=lenet", "dataset.max_train_samples=8192", "dataset.max_test_samples=256", "optimizer=adam",
              "optimizer.lr=0.001", "lr_schedule=constant", "trainer.grad_clip=null"],
    "char_lm": ["experiment=char_lm", "dataset.block_size=64", "dataset.max_test_samples=64", "lr_schedule=constant"],
}
REDUCERS = ("plain", "fixed_point", "gathered")


def command(model: str, workers: int, reducer: str, args) -> list[str]:
    strategy = ["strategy=single"] if workers == 1 else ["strategy=ddp", f"strategy.nproc_per_node={workers}"]
    mode = [] if reducer == "plain" else ["trainer.invariant=true", f"trainer.micro_shards={args.shards}",
                                          f"trainer.invariant_reduce={reducer}"]
    return train_py(*MODELS[model], *strategy, *mode, f"trainer.batch_size={args.batch_size}", "trainer.epochs=1",
                    f"trainer.max_steps={args.steps}", f"trainer.log_every_n_steps={args.log_every}",
                    "trainer.progress_bar=false", "trainer.keep_checkpoints=0", "trainer.accelerator=cpu")


def bytes_per_step(reducer: str, workers: int, shards: int, parameters: int, tensors: int) -> int:
    if workers == 1:
        return 0
    return {"plain": 4 * parameters, "fixed_point": 8 * parameters + 8 * tensors,
            "gathered": 4 * parameters * shards // workers}[reducer]


def measure(model: str, workers: int, reducer: str, args) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = run_timed(command(model, workers, reducer, args), Path(scratch), environment(1), timeout=1800)
        if out.returncode != 0:
            raise RuntimeError("\n".join(line for _, line in out.lines[-20:]))
        run = only_run_folder(Path(scratch))
        step_ms = [v for _, v in tensorboard_scalars(run)["time/step_ms"]][1:]
        weights = read_trained(run, "last")["model"]
    parameters = sum(t.numel() for t in weights.values() if t.is_floating_point())
    tensors = sum(1 for t in weights.values() if t.is_floating_point())
    return {"step_ms": sorted(step_ms)[len(step_ms) // 2],
            "bytes_per_step": bytes_per_step(reducer, workers, args.shards, parameters, tensors),
            "parameters": parameters}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="lenet,char_lm")
    p.add_argument("--workers", default="1,2", help="a comma list of worker counts, each dividing --shards")
    p.add_argument("--shards", type=int, default=8, help="trainer.micro_shards")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    args.models = names(p, "--models", args.models, tuple(MODELS))
    args.workers = [int(w) for w in names(p, "--workers", args.workers, ("1", "2", "4", "8"))]
    if any(args.shards % w for w in args.workers) or args.batch_size % args.shards:
        p.error(f"--shards={args.shards} must be a multiple of every --workers and divide --batch-size="
                f"{args.batch_size}")
    if args.steps < 2 * args.log_every:
        p.error(f"--steps={args.steps} must be at least 2 x --log-every={args.log_every}: the first interval is "
                "the warm-up")
    return args


def main() -> None:
    args = parse_args()
    variants = {f"{model} x{workers} {reducer}": (lambda m=model, w=workers, r=reducer: measure(m, w, r, args))
                for model in args.models for workers in args.workers for reducer in REDUCERS}
    samples = alternate(variants, args.repeats)
    results, rows = {}, []
    for name, taken in samples.items():
        model, workers, reducer = name.split()
        plain = samples[f"{model} {workers} plain"]
        step_ms = median_of(taken, "step_ms")
        results[name] = {"step_ms": step_ms, "bytes_per_step": taken[0]["bytes_per_step"],
                         "parameters": taken[0]["parameters"],
                         "step_time_over_plain": ratio(step_ms, median_of(plain, "step_ms")),
                         "bytes_over_plain": ratio(taken[0]["bytes_per_step"], plain[0]["bytes_per_step"]),
                         "samples": taken}
        r = results[name]
        rows.append([name, f"{step_ms:.1f}", r["step_time_over_plain"], r["bytes_per_step"], r["bytes_over_plain"]])
    print_table(["variant", "ms/step", "x plain", "bytes/step/rank", "x plain"], rows)
    write_results("invariant", {k: v for k, v in vars(args).items()}, results)


if __name__ == "__main__":
    main()
