"""Whether gradient compression pays: train.py strategy=ddp with 2 gloo workers, strategy.compression none, fp16 and
PowerSGD at ranks 1, 2 and 4, for LeNet (Fashion-MNIST) and experiment=char_lm's GPT, on two links: this machine's
loopback, and a slow link made here, a network namespace of the run's own (`unshare --net`, as root) whose loopback
is limited by `tc qdisc add dev lo root tbf rate 1gbit burst 256kb latency 50ms` (made for each run, gone with it;
no address leaves the namespace's loopback). Both links run with GLOO_SOCKET_IFNAME=lo.

Per run, from what it logged: the bytes ratio (comm/compression_ratio), gradient bytes each rank sent per step
(comm/bytes_sent/rank0), ms per step (time/step_ms) and per-rank wait (time/wait_ms, mean over the ranks), each the
median over the log intervals after PowerSGD's start (--start-step; the same steps for every variant), and the final
test metric (LeNet: accuracy; char LM: bits per character). Runs go seed by seed, every variant of a seed before the
next seed, so the machine's noise hits them alike; the table gives mean ± sd over the seeds.

    .venv/bin/python bench/compression.py                        # both links, both models, 3 seeds (~30 min)
    .venv/bin/python bench/compression.py --links loopback --models lenet --seeds 1
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchkit import commands
from benchkit.arguments import names
from benchkit.report import print_table, write_results
from benchkit.run_folder import only_run_folder, read_result, tensorboard_scalars
from benchkit.timed_process import run_timed

SLOW_LINK = "tbf rate 1gbit burst 256kb latency 50ms"
LINKS = {"loopback": None, "1gbit": SLOW_LINK}
VARIANTS = {
    "none": [],
    "fp16": ["strategy.compression=fp16"],
    **{f"powersgd r{r}": ["strategy.compression=powersgd", f"strategy.powersgd.rank={r}"] for r in (1, 2, 4)},
}
# LeNet: 2 epochs of 8,192 Fashion-MNIST images in batches of 128 (128 steps; train.py's default recipe otherwise);
# char LM: the preset's GPT (0.8M parameters) for 96 steps of 32 blocks of 64 characters
MODELS = {
    "lenet": (["dataset.max_train_samples=8192", "trainer.epochs=2", "trainer.batch_size=128"], "acc", "accuracy"),
    "char_lm": (["experiment=char_lm", "trainer.max_steps=96", "trainer.batch_size=32", "dataset.block_size=64",
                 "dataset.max_test_samples=512"], "bits_per_char", "bits/char"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--links", default=",".join(LINKS), help="comma list of " + ", ".join(LINKS))
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--start-step", type=int, default=17, help="strategy.powersgd.start_step of the PowerSGD runs")
    p.add_argument("--log-every", type=int, default=8)
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    args = p.parse_args(argv)
    for flag, value, allowed in (("--links", args.links, LINKS), ("--models", args.models, MODELS),
                                 ("--variants", args.variants, VARIANTS)):
        names(p, flag, value, allowed)
    return args


def slow_link_ready() -> str | None:
    """Why the slow link cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "the slow link needs root (unshare --net, tc)"
    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    return f"the slow link needs {', '.join(missing)}" if missing else None


def in_namespace(command: list[str], qdisc: str) -> list[str]:
    """`command` in a network namespace of its own whose loopback (its only link) is shaped by `qdisc`."""
    return ["unshare", "--net", "sh", "-c", f'ip link set lo up && tc qdisc add dev lo root {qdisc} && exec "$0" "$@"',
            *command]


def after_start(scalars: dict, tag: str, first_step: int) -> float | None:
    values = [v for step, v in scalars.get(tag, []) if step >= first_step]
    return statistics.median(values) if values else None


def measure(model: str, variant: str, link: str, seed: int, args, scratch: Path) -> dict:
    overrides, metric, _ = MODELS[model]
    command = commands.train_py(
        *overrides, "strategy=ddp", "strategy.nproc_per_node=2", "trainer.accelerator=cpu", f"trainer.seed={seed}",
        f"trainer.log_every_n_steps={args.log_every}", "trainer.checkpoint_every_n_steps=null",
        "trainer.progress_bar=false", *VARIANTS[variant],
        *([f"strategy.powersgd.start_step={args.start_step}"] if variant.startswith("powersgd") else []))
    if LINKS[link]:
        command = in_namespace(command, LINKS[link])
    cwd = Path(tempfile.mkdtemp(dir=scratch))
    env = {**commands.environment(None), "GLOO_SOCKET_IFNAME": "lo"}
    out = run_timed(command, cwd, env, args.timeout).check()
    folder = only_run_folder(cwd)
    result, scalars = read_result(folder), tensorboard_scalars(folder)
    # the first interval whose steps all come after PowerSGD's start (and after it the same ones for every variant)
    first = -(-(args.start_step + args.log_every - 1) // args.log_every) * args.log_every
    waits = [after_start(scalars, f"time/wait_ms/rank{r}", first) for r in (0, 1)]
    return {"ratio": after_start(scalars, "comm/compression_ratio", first),
            "bytes_per_step": after_start(scalars, "comm/bytes_sent/rank0", first),
            "step_ms": after_start(scalars, "time/step_ms", first),
            "wait_ms": statistics.mean(waits) if None not in waits else None,
            "metric": result[f"test_{metric}"], "line": result.get("compression", ""),
            "wall_seconds": out.wall_seconds}


def mean_sd(values: list[float], digits: int) -> str:
    if not values:
        return "-"
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    args = parse_args()
    links, models, variants = args.links.split(","), args.models.split(","), args.variants.split(",")
    if any(LINKS[link] for link in links):
        why = slow_link_ready()
        if why:
            raise SystemExit(f"bench/compression.py: {why}; run it as root, or --links loopback")
    samples: dict[str, list[dict]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-compression-") as tmp:
        for seed in range(1, args.seeds + 1):
            for link in links:
                for model in models:
                    for variant in variants:
                        sample = measure(model, variant, link, seed, args, Path(tmp))
                        samples.setdefault(f"{model}|{link}|{variant}", []).append(sample)
                        print(f"  seed {seed} {model} {link} {variant}: ratio {sample['ratio']:.1f}, "
                              f"{sample['step_ms']:.1f} ms/step, wait {sample['wait_ms']:.1f} ms, "
                              f"metric {sample['metric']:.4f} ({sample['wall_seconds']:.0f} s)", flush=True)
    minutes = (time.perf_counter() - started) / 60
    rows, results = [], {}
    for key, runs in samples.items():
        model, link, variant = key.split("|")
        column = lambda k: [r[k] for r in runs if r[k] is not None]  # noqa: E731
        results[key] = {"model": model, "link": link, "compression": variant,
                        "ratio": statistics.mean(column("ratio")),
                        "bytes_per_step": statistics.mean(column("bytes_per_step")),
                        "step_ms": column("step_ms"), "wait_ms": column("wait_ms"), "metric": column("metric"),
                        "samples": runs}
        rows.append([model, link, variant, f"{results[key]['ratio']:.1f}x",
                     f"{results[key]['bytes_per_step'] / 1e3:,.0f}", mean_sd(column("step_ms"), 1),
                     mean_sd(column("wait_ms"), 1), f"{mean_sd(column('metric'), 3)} {MODELS[model][2]}"])
    print()
    print_table(["model", "link", "compression", "bytes ratio", "kB sent/step/rank", "ms/step", "wait ms/step",
                 "final test metric"], rows)
    print(f"{len(samples) * args.seeds} runs in {minutes:.0f} min")
    write_results("compression", {**vars(args), "slow_link": SLOW_LINK, "minutes": round(minutes, 1)}, results)


if __name__ == "__main__":
    main()
