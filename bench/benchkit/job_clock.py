"""A Hydra callback that stamps each sweep job's start and end (wall clock, in the process that runs the job) into
<sweep folder>/job_clock.jsonl, and what bench/sweep_slots.py computes from those stamps: how long parallel job
slots stood idle. Named on the command line: `+hydra.callbacks.job_clock._target_=benchkit.job_clock.JobClock`."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback

CLOCK_FILE = "job_clock.jsonl"


class JobClock(Callback):
    def on_job_start(self, config, **kwargs) -> None:
        self.started = time.time()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        hydra_cfg = HydraConfig.get()
        stamp = {"job": int(hydra_cfg.job.num), "start": self.started, "end": time.time(), "pid": os.getpid(),
                 "rss_mib": _resident_mib()}
        with open(Path(hydra_cfg.sweep.dir) / CLOCK_FILE, "a") as f:  # one short line per write: appends don't mix
            f.write(json.dumps(stamp) + "\n")


def _resident_mib() -> float:
    """This process's resident memory now (Linux), to see whether a worker that runs many jobs keeps growing."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def read_clock(sweep_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (sweep_dir / CLOCK_FILE).read_text().splitlines()]


def slot_usage(jobs: list[dict], slots: int) -> dict:
    """From the first job's start to the last job's end: the makespan, the job-seconds, and the slot-seconds no
    job ran in (slots x makespan - job-seconds)."""
    begin, end = min(j["start"] for j in jobs), max(j["end"] for j in jobs)
    busy = sum(j["end"] - j["start"] for j in jobs)
    return {"jobs": len(jobs), "makespan_s": end - begin, "busy_s": busy, "idle_slot_s": slots * (end - begin) - busy}
