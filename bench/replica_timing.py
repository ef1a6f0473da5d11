"""What dp's per-replica timing (framework/telemetry/replica_clock.py) costs per training step, on CPU, in this one process.

`plain` is the model as strategy=dp ran it on the CPU before the timing existed; `timed` is what dp runs now
(framework/training/instrument.py): the forward pre-hook that opens a micro-batch, time_replicas' hooks (forward
start and end, backward start on the output, backward end by a multi-grad hook over the parameters), the four marks
per step, and the clock read and reset every --log-every steps as the meter does. Steps are train.py's with
in-memory data (forward, cross-entropy, backward, Adam step). Rounds alternate the two; medians, their ratio, and
the microseconds the timing adds per step. A tiny model (linear) shows the fixed cost per step that a real model's
step hides.

    .venv/bin/python bench/replica_timing.py --models lenet,linear --repeats 9
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from benchkit.alternation import alternate_steps_per_sec, median_of, ratio, seconds_for
from benchkit.arguments import config_options, names
from benchkit.report import print_table, write_results
from framework.models.build import build_model
from framework.common.paths import CONF_DIR
from framework.telemetry.replica_clock import ReplicaClock, time_replicas

SAMPLE = (1, 28, 28)  # Fashion-MNIST


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="lenet,linear", help="comma list of conf/model/ options")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=100, help="timed steps per round")
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--log-every", type=int, default=100, help="read and reset the clock every N steps")
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    names(p, "--models", args.models, config_options("model"))
    return args


class TrainingStep:
    def __init__(self, model_name: str, timed: bool, batch_size: int, log_every: int):
        torch.manual_seed(0)
        self.model = build_model(OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"), SAMPLE, 10)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.clock = None
        if timed:  # as framework/training/instrument.py's wait_clock() does for dp without GPUs
            self.clock = ReplicaClock([torch.device("cpu")])
            self.model.register_forward_pre_hook(lambda *_: self.clock.begin_micro_batch())
            time_replicas(self.model, self.clock, replicated=False)
        self.x = torch.randn(batch_size, *SAMPLE)
        self.labels = torch.randint(0, 10, (batch_size,))
        self.log_every, self.done = log_every, 0

    def __call__(self) -> None:
        F.cross_entropy(self.model(self.x), self.labels).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.done += 1
        if self.clock is not None and self.done % self.log_every == 0:
            self.clock.read(1), self.clock.phases(1)
            self.clock.reset()


def main() -> None:
    args = parse_args()
    results, rows = {}, []
    for model_name in args.models.split(","):
        print(f"{model_name}: plain vs timed", flush=True)
        steps = {name: TrainingStep(model_name, name == "timed", args.batch_size, args.log_every)
                 for name in ("plain", "timed")}
        for step in steps.values():
            seconds_for(step, args.warmup_steps)
        samples = alternate_steps_per_sec(steps, args.steps, args.repeats)
        plain, timed = (median_of(samples[name], "steps_per_sec") for name in ("plain", "timed"))
        added_us = (1 / timed - 1 / plain) * 1e6
        results[model_name] = {"plain_steps_per_sec": plain, "timed_steps_per_sec": timed,
                               "ratio": ratio(timed, plain), "added_us_per_step": added_us, "samples": samples}
        rows.append([model_name, plain, timed, ratio(timed, plain), added_us])
    print()
    print(f"{torch.get_num_threads()} threads, batch {args.batch_size}")
    print_table(["model", "plain steps/s", "timed steps/s", "ratio (>= 0.98)", "us added per step"], rows)
    write_results("replica_timing", vars(args), results)


if __name__ == "__main__":
    main()
