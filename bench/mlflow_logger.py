"""What logger=mlflow adds to a run: the whole `train.py strategy=single` command (LeNet, synthetic data, 100 steps,
a log every 10 steps and an evaluation at the end) with logger=tensorboard (the default) and with
logger=[tensorboard,mlflow] (a local SQLite store, one per round), alternating; the difference of the medians is
MLflow's cost per run (its import and store on rank 0, params, one log_batch per interval, artifacts, the status).

    .venv/bin/python bench/mlflow_logger.py --repeats 3
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit.alternation import alternate, median_of  # noqa: E402
from benchkit.commands import environment, train_py  # noqa: E402
from benchkit.report import print_table, write_results  # noqa: E402
from benchkit.timed_process import run_timed  # noqa: E402

RUN = ["strategy=single", "dataset=synthetic", "trainer.max_steps=100", "trainer.epochs=1",
       "trainer.log_every_n_steps=10", "trainer.progress_bar=false", "trainer.accelerator=cpu"]


def whole_run(logger: str, scratch: Path, round_no: list[int]) -> dict:
    round_no[0] += 1
    folder = scratch / f"{round_no[0]}"
    folder.mkdir()
    store = f"callbacks.mlflow.tracking_uri=sqlite:///{folder / 'mlflow.db'}"
    overrides = [*RUN, f"logger={logger}", *([store] if "mlflow" in logger else [])]
    out = run_timed(train_py(*overrides), cwd=folder, env=environment(None), timeout=600).check()
    return {"seconds": out.wall_seconds}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def main() -> None:
    args = parse_args()
    counter = [0]
    with tempfile.TemporaryDirectory() as tmp:
        samples = alternate({name: (lambda logger=logger: whole_run(logger, Path(tmp), counter))
                             for name, logger in (("tensorboard", "tensorboard"),
                                                  ("tensorboard+mlflow", "[tensorboard,mlflow]"))}, args.repeats)
    plain, mlflow = median_of(samples["tensorboard"], "seconds"), median_of(samples["tensorboard+mlflow"], "seconds")
    results = {"samples": samples, "tensorboard_s": plain, "tensorboard_mlflow_s": mlflow,
               "mlflow_cost_s": mlflow - plain, "ratio": mlflow / plain}
    print_table(["logger", "whole run (median)"], [["tensorboard", f"{plain:.2f} s"],
                                                   ["tensorboard+mlflow", f"{mlflow:.2f} s"]])
    print(f"MLflow adds {mlflow - plain:.2f} s per run ({mlflow / plain:.2f}x)")
    write_results("mlflow_logger", vars(args), results)


if __name__ == "__main__":
    main()
