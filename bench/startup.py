"""Startup on CPU: seconds from the command to the first training step, for `train.py strategy=single`
and `strategy=ddp` (2 gloo workers), next to the hand-written baselines started the same way
(bench/baselines/plain_loop.py, `torchrun bench/baselines/ddp_torchrun.py`), and for single the floor of any
PyTorch program here (bench/baselines/torch_floor.py: import torch, one optimizer step of a tiny model).

Runs train 1 step with a progress line after it; this script stamps the output lines as they arrive:
'training ...' (printed right before the loop) gives the time to the loop, 'step 1/1' the time to the
first finished step. One untimed round first (warm file cache), then A, B, A, B; medians. A side's round that
fails (a non-zero exit: the torchrun script can abort at teardown after its step) is run once more, then counted as
failed; bench/results/startup.json is written after every round, so a later failure loses nothing before it.
Targets: single <= 3 s, ddp-2 <= 6 s. --against DIR adds DIR's train.py (another checkout, e.g.
`git archive <commit> | tar -x -C /tmp/before`) as a side of its own in the same alternation.

    .venv/bin/python bench/startup.py --repeats 5
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import RoundFailed, alternate, measured, median_of
from benchkit.arguments import names
from benchkit.progress_lines import step_times, training_start_time
from benchkit.report import print_table, write_results
from benchkit.timed_process import run_timed

TARGETS = {"single": 3.0, "ddp": 6.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="single,ddp", help="comma list of " + ", ".join(TARGETS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ddp-workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=120, help="seconds per run")
    p.add_argument("--against", type=Path, default=None, help="another checkout whose train.py runs as a side too")
    args = p.parse_args(argv)
    names(p, "--modes", args.modes, TARGETS)
    return args


def commands_for(mode: str, workers: int, against: Path | None = None) -> dict[str, list[str]]:
    one_step = ["trainer.max_steps=1", "trainer.log_every_n_steps=1", "dataset.max_test_samples=500"]
    train = ["strategy=single"] if mode == "single" else ["strategy=ddp", f"strategy.nproc_per_node={workers}"]
    sides = {"train.py": commands.train_py(*train, *one_step)}
    if against is not None:
        sides[f"{against}/train.py"] = commands.train_py(*train, *one_step, repo=against)
    if mode == "single":
        return {**sides, "plain_loop.py": commands.baseline("plain_loop.py", "--steps=1", "--log-every=1"),
                "torch_floor.py": commands.baseline("torch_floor.py")}
    return {**sides,
            "torchrun ddp_torchrun.py": commands.torchrun("ddp_torchrun.py", workers, "--steps=1", "--log-every=1")}


def timer(command: list[str], workdir: Path, timeout: float):
    def measure() -> dict:
        cwd = Path(tempfile.mkdtemp(dir=workdir))
        out = run_timed(command, cwd, commands.environment(None), timeout)
        first_step = step_times(out.lines).get(1)
        problem = out.problem() or (None if first_step is not None else "no 'step 1/1' line")
        if problem is not None:
            print(out.text(12), flush=True)
            after = ", after its first step" if first_step is not None else ""
            raise RoundFailed(f"{problem}{after}")
        return {"to_loop": training_start_time(out.lines), "to_first_step": first_step, "whole_run": out.wall_seconds}
    return measure


def summary_of(mode: str, samples: dict[str, list[dict]]) -> dict:
    """results.json's entry of a mode: each side's medians over its rounds that did not fail, and every round."""
    sides = {}
    for name, side in samples.items():
        medians = {key: median_of(side, key) for key in ("to_loop", "to_first_step", "whole_run")}
        sides[name] = {**medians, "failed_rounds": sum("failed" in s for s in side), "samples": side}
    return {"target_seconds": TARGETS.get(mode), "sides": sides}


def main() -> None:
    args = parse_args()
    settings = {**vars(args), "against": args.against and str(args.against)}
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        for mode in args.modes.split(","):
            variants = {name: timer(cmd, Path(tmp), args.timeout)
                        for name, cmd in commands_for(mode, args.ddp_workers, args.against).items()}
            print(f"{mode}: warm-up round (not counted)", flush=True)
            for measure in variants.values():
                measured(measure)  # a failure is said, and the counted rounds go on

            def save(samples, mode=mode):
                results[mode] = summary_of(mode, samples)
                write_results("startup", settings, results)

            alternate(variants, args.repeats, retries=1, after_each=save)
    rows = [[mode, name, side["to_loop"], side["to_first_step"], side["whole_run"], side["failed_rounds"],
             TARGETS.get(mode) if name == "train.py" else None]
            for mode, m in results.items() for name, side in m["sides"].items()]
    print()
    print_table(["mode", "command", "s to loop", "s to first step", "s whole run (1 step)", "failed rounds",
                 "target"], rows)


if __name__ == "__main__":
    main()
