"""plan.py's rows against real runs: for each configuration, the seconds plan.py takes for its row (in this process,
median of --repeats, the first row apart: it pays the imports and the data), rank 0's planned peak (a pipeline's:
each rank's, its ranks hold different stages and micro-batches in flight), and the peak each
rank of a real run of the same configuration reaches (bench/probes/allocator_peak.py: W processes in a gloo group,
the framework's own parallelize and two steps, the CPU allocator's events as torch.profiler records them), with
planned / measured per rank. The table in docs/plan.md comes from here.

    .venv/bin/python bench/plan.py --repeats 3
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchkit import commands
from benchkit.arguments import names
from benchkit.report import print_table, write_results

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the framework this checkout holds
# the user project's package (mypkg, USER_PROJECT below), as its users' PYTHONPATH has it
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples" / "my_project"))
from framework.common.paths import overrides_and_config_dir  # noqa: E402
from framework.plan.command import composed_runs  # noqa: E402
from framework.plan.rows import plan_row  # noqa: E402

MIB = 2 ** 20
LENET = ("model=lenet", "dataset=fashion_mnist")
CHAR_LM = ("experiment=char_lm",)
# a user's project (examples/my_project): its own model (mypkg.mesh_lm.ResidualLM), data and tensor-parallel plan,
# from --config-dir with the project on the import path, as its users run it
USER_PROJECT = commands.REPO / "examples" / "my_project"
USER_LM = ("--config-dir", str(USER_PROJECT / "conf"), "experiment=task_residual_lm", "model.hidden=256")
# name: (overrides, workers)
CONFIGURATIONS = {
    "lenet_single": ((*LENET, "strategy=single"), 1),
    "lenet_ddp2": ((*LENET, "strategy=ddp"), 2),
    "lenet_fsdp2": ((*LENET, "strategy=fsdp"), 2),
    "gpt_single": ((*CHAR_LM, "strategy=single"), 1),
    "gpt_ddp2": ((*CHAR_LM, "strategy=ddp"), 2),
    "gpt_ddp4": ((*CHAR_LM, "strategy=ddp"), 4),
    "gpt_fsdp2": ((*CHAR_LM, "strategy=fsdp"), 2),
    "gpt_fsdp4": ((*CHAR_LM, "strategy=fsdp"), 4),
    "gpt_tp2": ((*CHAR_LM, "strategy=tp"), 2),
    "gpt_tp2_dp_shard2": ((*CHAR_LM, "strategy=tp", "strategy.dp_shard=2"), 4),
    "lenet_zero2": ((*LENET, "strategy=deepspeed", "strategy.zero_stage=2"), 2),
    "gpt_zero1": ((*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=1"), 2),
    "gpt_zero2": ((*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=2"), 2),
    "gpt_zero2_accum2": ((*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=2", "trainer.grad_accum=2"), 2),
    "lenet_zero3": ((*LENET, "strategy=deepspeed", "strategy.zero_stage=3"), 2),
    "gpt_zero3": ((*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=3"), 2),
    # nothing persistent, few tensors live at a time, a small bucket: the gathered parameters are a visible share
    "gpt_zero3_gathered": ((*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=3",
                            "+strategy.config.zero_optimization.reduce_bucket_size=1000000",
                            "+strategy.config.zero_optimization.stage3_param_persistence_threshold=0",
                            "+strategy.config.zero_optimization.stage3_max_live_parameters=100000",
                            "+strategy.config.zero_optimization.stage3_max_reuse_distance=0"), 2),
    "lenet_pp2_1f1b": ((*LENET, "strategy=pp", "strategy.schedule=1F1B"), 2),
    "gpt_pp2_1f1b": ((*CHAR_LM, "strategy=pp", "strategy.schedule=1F1B"), 2),
    "gpt_pp2_gpipe": ((*CHAR_LM, "strategy=pp", "strategy.schedule=GPipe"), 2),
    "user_single": ((*USER_LM, "strategy=single"), 1),
    "user_ddp2": ((*USER_LM, "strategy=ddp"), 2),
    "user_fsdp2": ((*USER_LM, "strategy=fsdp"), 2),
    "user_tp2_plan": ((*USER_LM, "strategy=tp_plan"), 2),
}
PIPELINES = ("lenet_pp2_1f1b", "gpt_pp2_1f1b", "gpt_pp2_gpipe")  # planned rank by rank: a pipeline's ranks differ
PEAK_LINE = re.compile(r"^allocator peak rank (\d+): (\d+)$", re.M)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configurations", default=",".join(CONFIGURATIONS),
                   help="comma list of " + ", ".join(CONFIGURATIONS))
    p.add_argument("--repeats", type=int, default=3, help="plans of each row (the seconds' median)")
    p.add_argument("--timeout", type=int, default=600, help="seconds for each real run")
    args = p.parse_args(argv)
    names(p, "--configurations", args.configurations, tuple(CONFIGURATIONS))
    return args


def overrides_of(name: str) -> list[str]:
    overrides, workers = CONFIGURATIONS[name]
    return [*overrides, "trainer.accelerator=cpu", *([f"strategy.nproc_per_node={workers}"] if workers > 1 else [])]


def planned(name: str) -> tuple[list[int], float]:
    """The planned peak (bytes) of rank 0, or of each rank of a pipeline, and the seconds the row took, in this
    process (the row: every pipeline rank, its largest peak)."""
    overrides, config_dir = overrides_and_config_dir(overrides_of(name), "bench/plan.py")
    cfg = next(composed_runs(overrides, config_dir))
    started = time.perf_counter()
    row = plan_row(cfg)
    seconds = time.perf_counter() - started
    if name not in PIPELINES:
        return [row.peak], seconds
    return [plan_row(cfg, rank=rank).peak for rank in range(CONFIGURATIONS[name][1])], seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measured(name: str, timeout: int) -> list[int]:
    """Each rank's peak (bytes) in a real run: one process per rank, 1 thread each."""
    workers = CONFIGURATIONS[name][1]
    port, deepspeeds = free_port(), free_port()
    probe = [commands.PYTHON, str(commands.REPO / "bench" / "probes" / "allocator_peak.py")]
    # DeepSpeed reads the launcher's variables beside the group the probe makes
    ranks = [subprocess.Popen([*probe, str(workers), str(rank), str(port), *overrides_of(name)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={**commands.environment(1), "PYTHONPATH": os.pathsep.join(
                                  filter(None, [str(USER_PROJECT), os.environ.get("PYTHONPATH")])),
                                   "LOCAL_RANK": str(rank), "RANK": str(rank),
                                   "WORLD_SIZE": str(workers), "LOCAL_WORLD_SIZE": str(workers),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(deepspeeds)},
                              cwd=commands.REPO) for rank in range(workers)]
    outputs = []
    try:
        for process in ranks:
            outputs.append(process.communicate(timeout=timeout)[0])
    finally:
        for process in ranks:  # a rank left waiting for a failed one
            if process.poll() is None:
                process.kill()
                process.wait()
    peaks = {int(r): int(b) for out in outputs for r, b in PEAK_LINE.findall(out)}
    if sorted(peaks) != list(range(workers)):
        raise RuntimeError(f"{name}: not every rank measured its peak:\n" + "\n".join(o[-2000:] for o in outputs))
    return [peaks[r] for r in range(workers)]


def main() -> None:
    args = parse_args()
    results, rows = {}, []
    for index, name in enumerate(args.configurations.split(",")):
        plans = [planned(name) for _ in range(args.repeats)]
        peaks = plans[0][0]
        seconds = [s for _, s in plans]
        real = measured(name, args.timeout)
        mine = peaks if len(peaks) == len(real) else peaks * len(real)  # each rank's plan, or rank 0's for all
        results[name] = {"overrides": overrides_of(name), "planned_rank0": peaks[0], "planned_per_rank": peaks,
                         "measured_per_rank": real, "plan_seconds": seconds,
                         "plan_seconds_median": statistics.median(seconds), "first_row": index == 0}
        rows.append([name, CONFIGURATIONS[name][1], ", ".join(f"{p / MIB:.2f}" for p in peaks),
                     ", ".join(f"{m / MIB:.2f}" for m in real), ", ".join(f"{p / m:.3f}" for p, m in zip(mine, real)),
                     f"{statistics.median(seconds):.1f}"])
        print(f"{name}: planned {rows[-1][2]} MiB, measured {rows[-1][3]} MiB", flush=True)
    print()
    print_table(["configuration", "workers", "planned MiB (rank 0; a pipeline's each rank)", "measured MiB (each rank)",
                 "planned / measured", "s per row"], rows)
    write_results("plan", vars(args), results)


if __name__ == "__main__":
    main()
