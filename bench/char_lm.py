"""experiment=char_lm against a hand-written nanoGPT-style loop of the same model, text and batch, on CPU, in tokens
per second: one process, and 2 DDP workers (train.py strategy=ddp vs torchrun bench/baselines/nanogpt_loop.py).

Both sides: the preset's transformer (4 layers, 4 heads, 128 wide, block 128; --layers etc. to change), global batch
64, AdamW with weight decay 0.1, gradient clipping at 1.0, a constant lr (train.py: lr_schedule=constant), a
progress line every --log-every steps. tokens/s = steps/s x batch x block, steps/s from the time between the
progress line that ends the warm-up and the last one (startup, data and warm-up excluded; train.py's logging
included), so --warmup-steps and --steps are multiples of --log-every. A, B, A, B; medians and the ratio
framework / hand-written (target >= 0.98).

    .venv/bin/python bench/char_lm.py --repeats 3
    .venv/bin/python bench/char_lm.py --repeats 2 --warmup-steps 10 --steps 30 --log-every 10
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
from benchkit.timed_process import run_timed


MODES = ("single", "ddp")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES), help="comma list of " + ", ".join(MODES))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--steps", type=int, default=60, help="timed steps")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args(argv)
    names(p, "--modes", args.modes, MODES)
    progress_window(p, args.warmup_steps, args.steps, args.log_every)
    return args


def main() -> None:
    args = parse_args()
    total = args.warmup_steps + args.steps
    tokens_per_step = args.batch_size * args.block_size
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="bench-char-lm-") as tmp:
        for mode in args.modes.split(","):
            workers = 1 if mode == "single" else 2
            threads = max(1, commands.cpu_cores() // workers)
            train = commands.train_py(
                "experiment=char_lm", f"strategy={mode}", "trainer.accelerator=cpu", f"trainer.max_steps={total}",
                f"trainer.log_every_n_steps={args.log_every}", f"trainer.batch_size={args.batch_size}",
                f"dataset.block_size={args.block_size}", f"model.n_layer={args.layers}", "lr_schedule=constant",
                "trainer.progress_bar=false", "trainer.checkpoint_every_n_steps=null",
                *([f"strategy.nproc_per_node={workers}"] if mode != "single" else []))
            script = [f"--batch-size={args.batch_size}", f"--block-size={args.block_size}", f"--layers={args.layers}",
                      f"--steps={total}", f"--log-every={args.log_every}"]
            baseline = (commands.baseline("nanogpt_loop.py", *script) if mode == "single"
                        else commands.torchrun("nanogpt_loop.py", workers, *script))

            def side(command):
                def measure() -> dict:
                    cwd = Path(tempfile.mkdtemp(dir=tmp))
                    out = run_timed(command, cwd, commands.environment(threads), args.timeout).check()
                    return {"tokens_per_sec": tokens_per_step * steps_per_second(out.lines, args.warmup_steps, total)}
                return measure

            print(f"{mode}: {workers} process(es) x {threads} thread(s), batch {args.batch_size} x block "
                  f"{args.block_size}, {args.warmup_steps} warm-up + {args.steps} timed steps", flush=True)
            samples = alternate({"framework": side(train), "baseline": side(baseline)}, args.repeats)
            fw, base = (median_of(samples[k], "tokens_per_sec") for k in ("framework", "baseline"))
            results[mode] = {"processes": workers, "threads_per_process": threads, "framework_tokens_per_sec": fw,
                             "baseline_tokens_per_sec": base, "ratio": ratio(fw, base), "samples": samples}
            rows.append([mode, f"{workers} x {threads}", fw, base, ratio(fw, base)])
    print()
    print_table(["mode", "procs x threads", "train.py tokens/s", "nanoGPT-style loop tokens/s", "ratio (>= 0.98)"], rows)
    write_results("char_lm", vars(args), results)


if __name__ == "__main__":
    main()
