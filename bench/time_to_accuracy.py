"""Time to a Fashion-MNIST test accuracy (default 0.90): train.py with its defaults (LeNet, SGD with Nesterov
momentum under a warm-up + cosine lr schedule, gradient clipping at norm 1, 3 epochs, batch 128, in-memory
data, channels_last on CPU)
against the seed-style tutorial script bench/baselines/tutorial_fashion_mnist.py (ToTensor +
DataLoader(batch_size=64, shuffle=True), loss.item() every step, Adam lr 1e-3), on CPU.

Seconds from the command to the line reporting a test accuracy >= target: everything a user waits for
(start-up, data loading, training, the evaluations on the way). A run stops as soon as it gets there.
Both sides evaluate after every epoch. train.py runs exactly as configured (its schedule spans its
epochs, so no epoch count is forced on it; a run that ends below the target counts as a miss); the tutorial
trains up to --max-epochs. A, B, A, B; medians and the speed-up tutorial / train.py (target >= 5x).

    .venv/bin/python bench/time_to_accuracy.py --repeats 1
    # the tutorial's own recipe inside train.py: what the input path and loop alone are worth
    .venv/bin/python bench/time_to_accuracy.py --override optimizer=adam --override lr_schedule=constant \
        --override trainer.epochs=15
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.progress_lines import accuracy_of, evaluations
from benchkit.report import print_table, write_results
from benchkit.timed_process import run_timed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=float, default=0.90)
    p.add_argument("--repeats", type=int, default=1, help="rounds of train.py, tutorial")
    p.add_argument("--max-epochs", type=int, default=15, help="the tutorial gives up after this many epochs")
    p.add_argument("--override", action="append", default=[],
                   help="extra train.py override (repeatable), e.g. --override trainer.batch_size=256")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    args = p.parse_args(argv)
    if not 0 < args.target <= 1:
        p.error(f"--target={args.target}: a test accuracy, above 0 and at most 1")
    return args


def train_commands(args) -> list[list[str]]:
    """train.py's overrides (tests/unit/test_bench_readme.py composes them)."""
    return [["trainer.eval_every_n_epochs=1", *args.override]]


def reaches(target: float):
    def stop_when(line: str) -> bool:
        acc = accuracy_of(line)
        return acc is not None and acc >= target
    return stop_when


def measure(command: list[str], cwd_root: Path, args) -> dict:
    cwd = Path(tempfile.mkdtemp(dir=cwd_root))
    out = run_timed(command, cwd, commands.environment(None), args.timeout, stop_when=reaches(args.target)).check()
    evals = evaluations(out.lines)
    hit = next((e for e in evals if e["test_acc"] >= args.target), None)
    return {
        "seconds_to_target": hit["seconds"] if hit else None,
        "epochs_to_target": hit["epoch"] if hit else None,
        "best_test_acc": max((e["test_acc"] for e in evals), default=None),
        "seconds_run": out.wall_seconds,
        "evaluations": evals,
    }


def main() -> None:
    args = parse_args()
    framework_cmd = commands.train_py(*train_commands(args)[0])
    tutorial_cmd = commands.baseline("tutorial_fashion_mnist.py", f"--epochs={args.max_epochs}")
    run_timed(commands.baseline("tutorial_fashion_mnist.py", "--prepare-only"), commands.REPO,
              commands.environment(None), 120).check()  # torchvision's folder layout, made once, untimed
    print(f"time to test accuracy {args.target} (the tutorial: at most {args.max_epochs} epochs)", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-tta-") as tmp:
        samples = alternate({
            "train.py": lambda: measure(framework_cmd, Path(tmp), args),
            "tutorial": lambda: measure(tutorial_cmd, Path(tmp), args),
        }, args.repeats)
    fw, tut = median_of(samples["train.py"], "seconds_to_target"), median_of(samples["tutorial"], "seconds_to_target")
    results = {
        "target": args.target,
        "train_py_seconds": fw, "tutorial_seconds": tut, "speedup": ratio(tut, fw),
        "train_py_epochs": median_of(samples["train.py"], "epochs_to_target"),
        "tutorial_epochs": median_of(samples["tutorial"], "epochs_to_target"),
        "train_py_command": " ".join(framework_cmd[1:]), "tutorial_command": " ".join(tutorial_cmd[1:]),
        "samples": samples,
    }
    print()
    print_table(["side", f"seconds to {args.target}", "epochs", "best acc"], [
        [name, median_of(s, "seconds_to_target"), median_of(s, "epochs_to_target"), median_of(s, "best_test_acc")]
        for name, s in samples.items()
    ])
    print(f"speed-up (tutorial / train.py, target >= 5x): {results['speedup'] or float('nan'):.2f}x")
    # Runs with overrides (e.g. trainer.channels_last=true) are kept beside the default one.
    suffix = "".join("_" + o.replace("trainer.", "").replace("=", "-").replace(".", "-") for o in args.override)[:80]
    write_results("time_to_accuracy" + suffix, vars(args), results)


if __name__ == "__main__":
    main()
