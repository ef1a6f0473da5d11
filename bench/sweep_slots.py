"""Idle slot time of parallel sweep jobs on CPU (2 slots: hydra/launcher=joblib hydra.launcher.n_jobs=2).

Every job is stamped at its start and end by a Hydra callback (benchkit/job_clock.py); from the first start to the
last end, slots x makespan - job-seconds is the slot time no job ran in. Two cases, each side by side in
alternation (A, B, A, B):

- optuna: an Optuna study of 8 trials, 2 at once, whose trials take 10 to 160 steps (a seeded random sampler, so
  both sides get the same trials). `hydra/sweeper=optuna` (the plugin: batches of 2, each waits for its slower
  trial) against `hydra/sweeper=resumable_optuna` (a freed slot asks for the next trial at once).
- resumed: a 12-job seed sweep run again into its folder after its first 6 jobs finished (those are reported in
  50 ms, the other 6 train). --against DIR's train.py (a checkout without the fix, e.g.
  `git worktree add /tmp/before 26260b5`) against this checkout's: before the fix loky replaced each worker after
  its first training job (its memory grew 300 MB past the tiny first task: "a leak"), and the new worker's
  interpreter and imports left its slot idle.

    .venv/bin/python bench/sweep_slots.py --repeats 3 --against /tmp/before
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from benchkit import commands
from benchkit.alternation import alternate, median_of, ratio
from benchkit.arguments import names
from benchkit.job_clock import read_clock, slot_usage
from benchkit.report import print_table, write_results
from benchkit.timed_process import run_timed

SLOTS = 2
CLOCK = "+hydra.callbacks.job_clock._target_=benchkit.job_clock.JobClock"
JOB = ["strategy=single", "dataset=synthetic", "dataset.train_size=8192", "dataset.test_size=256",
       "trainer.batch_size=32", "trainer.log_every_n_steps=50", "trainer.accelerator=cpu",
       "hydra/launcher=joblib", f"hydra.launcher.n_jobs={SLOTS}", CLOCK]
STUDY = ["hydra/sweeper/sampler=random", "hydra.sweeper.sampler.seed=1", "hydra.sweeper.n_trials=8",
         f"hydra.sweeper.n_jobs={SLOTS}", "hydra.sweeper.direction=maximize", "trainer.max_steps=choice(10,40,80,160)"]
RESUMED = ["trainer.max_steps=60", "trainer.seed=range(1,13)"]
CASES = ("optuna", "resumed")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
    p.add_argument("--against", type=Path, default=None, help="a checkout without the fix, for the resumed case")
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args(argv)
    names(p, "--cases", args.cases, CASES)
    return args


def sweep(command: list[str], sweep_dir: Path, timeout: float) -> dict:
    """Run a sweep into sweep_dir; the slot usage of the jobs it ran."""
    env = commands.environment(None)
    env["PYTHONPATH"] = str(commands.REPO / "bench")  # the job clock callback, in the joblib workers too
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "job_clock.jsonl").unlink(missing_ok=True)
    run_timed([*command, f"hydra.sweep.dir={sweep_dir}"], sweep_dir.parent, env, timeout).check()
    return slot_usage(read_clock(sweep_dir), SLOTS)


def optuna_case(workdir: Path, timeout: float) -> dict:
    def side(sweeper: str):
        return lambda: sweep(commands.train_py("-m", f"hydra/sweeper={sweeper}", *STUDY, *JOB),
                             Path(tempfile.mkdtemp(dir=workdir)) / "sweep", timeout)
    return {"plugin optuna (batches)": side("optuna"), "resumable_optuna (free slots)": side("resumable_optuna")}


def resumed_case(workdir: Path, against: Path, timeout: float) -> dict:
    half = workdir / "half" / "sweep"
    sweep(commands.train_py("-m", *JOB, "trainer.max_steps=60", "trainer.seed=range(1,7)"), half, timeout)

    def side(repo: Path):
        def measure() -> dict:
            sweep_dir = Path(tempfile.mkdtemp(dir=workdir)) / "sweep"
            shutil.copytree(half, sweep_dir)
            return sweep(commands.train_py("-m", *JOB, *RESUMED, repo=repo), sweep_dir, timeout)
        return measure
    return {f"before ({against})": side(against), "this checkout": side(commands.REPO)}


def main() -> None:
    args = parse_args()
    results, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="sweep_slots_") as tmp:
        for case in args.cases.split(","):
            workdir = Path(tmp) / case
            workdir.mkdir()
            if case == "resumed" and args.against is None:
                print("resumed: skipped (needs --against DIR, a checkout without the fix)")
                continue
            sides = optuna_case(workdir, args.timeout) if case == "optuna" else \
                resumed_case(workdir, args.against, args.timeout)
            print(f"{case}:", flush=True)
            samples = alternate(sides, args.repeats)
            results[case] = samples
            (before, after) = sides
            for key in ("makespan_s", "idle_slot_s", "busy_s"):
                b, a = median_of(samples[before], key), median_of(samples[after], key)
                rows.append([case, key, f"{b:.2f}", f"{a:.2f}", f"{ratio(a, b):.3f}"])
    print_table(["case", "median of", "before", "after", "after/before"], rows)
    write_results("sweep_slots", vars(args) | {"against": str(args.against)}, results)


if __name__ == "__main__":
    main()
