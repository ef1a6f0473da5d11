"""One rank's profiled steps split into computation, communication and idle, from its Chrome trace (what
torch.profiler exports): the three add up to the steps' time.

On a GPU the timeline is the GPU's (kernels): NCCL kernels are communication, every other kernel and memory copy is
computation, and communication that overlaps computation counts as computation (only exposed communication costs
time). On the CPU it is the training thread's: its operators are computation, collectives (c10d::* on it, and gloo's
own threads' gloo:* ranges) are communication where no operator of the thread runs, and the rest is idle (Python,
waiting). The steps are the `train step N` ranges the profiler callback records (framework/callbacks/profiler.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "train step "
Spans = list[tuple[float, float]]


@dataclass
class Breakdown:
    steps: int
    total_ms: float
    computation_ms: float
    communication_ms: float
    idle_ms: float
    timeline: str  # "GPU" or "CPU"

    def per_step_ms(self) -> dict[str, float]:
        n = max(1, self.steps)
        return {"step": self.total_ms / n, "computation": self.computation_ms / n,
                "communication": self.communication_ms / n, "idle": self.idle_ms / n}

    def describe(self) -> str:
        ms = self.per_step_ms()
        share = {k: 100 * v / ms["step"] if ms["step"] else 0.0 for k, v in ms.items()}
        return (f"{ms['step']:.1f} ms/step = computation {ms['computation']:.1f} ({share['computation']:.0f}%) + "
                f"communication {ms['communication']:.1f} ({share['communication']:.0f}%) + idle {ms['idle']:.1f} "
                f"({share['idle']:.0f}%) on the {self.timeline} timeline, {self.steps} step(s)")


def breakdown_of(trace: Path) -> Breakdown:
    events = [e for e in json.loads(Path(trace).read_text())["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    cpu_steps = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(STEP_PREFIX)]
    on_gpu = any(e.get("cat") == "kernel" for e in events)
    if on_gpu:
        gpu_steps = [e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith(STEP_PREFIX)]
        window = _union(_spans(gpu_steps or cpu_steps))
        device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        communication = _spans(e for e in device if "nccl" in e["name"].lower())
        computation = _spans(e for e in device if "nccl" not in e["name"].lower())
    else:
        thread = cpu_steps[0]["tid"] if cpu_steps else None
        window = _union(_spans(cpu_steps))
        communication = _spans(e for e in events if is_collective(e) and (e["tid"] == thread or
                                                                         e.get("cat") == "user_annotation"))
        computation = _spans(e for e in events
                             if e.get("cat") == "cpu_op" and e["tid"] == thread and not is_collective(e))
    total = _length(window)
    busy = _clip(_union(computation), window)
    exposed = _subtract(_clip(_union(communication), window), busy)
    compute_us, comm_us = _length(busy), _length(exposed)
    return Breakdown(len(cpu_steps), total / 1e3, compute_us / 1e3, comm_us / 1e3,
                     max(0.0, total - compute_us - comm_us) / 1e3, "GPU" if on_gpu else "CPU")


def is_collective(event: dict) -> bool:
    name = event["name"]
    return name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms")) or "nccl" in name.lower()


def _spans(events) -> Spans:
    return [(e["ts"], e["ts"] + e["dur"]) for e in events]


def _union(spans: Spans) -> Spans:
    merged: Spans = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _clip(spans: Spans, window: Spans) -> Spans:
    """The parts of (merged) spans inside (merged) window."""
    out: Spans = []
    for ws, we in window:
        out.extend((max(s, ws), min(e, we)) for s, e in spans if s < we and e > ws)
    return _union(out)


def _subtract(spans: Spans, minus: Spans) -> Spans:
    out: Spans = []
    for start, end in spans:
        cursor = start
        for ms, me in minus:
            if me <= cursor or ms >= end:
                continue
            if ms > cursor:
                out.append((cursor, ms))
            cursor = max(cursor, me)
        if cursor < end:
            out.append((cursor, end))
    return out


def _length(spans: Spans) -> float:
    return sum(end - start for start, end in spans)
