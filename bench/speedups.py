"""trainer.channels_last and trainer.compile (framework/training/speedups.py) on CPU: training steps/s of each model
with each combination, in this one process. A step is what train.py's loop does with in-memory data:
normalize a uint8 batch (and make it channels_last when the model is), forward, cross-entropy,
backward, Adam step. The first step of each variant is timed on its own (it holds torch.compile's
compile time), then a warm-up, then rounds that alternate the variants; medians and the speed-up over
the plain model.

    .venv/bin/python bench/speedups.py --models lenet,simple_cnn --repeats 5
"""
from __future__ import annotations

import argparse
import copy

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from benchkit.alternation import alternate_steps_per_sec, median_of, ratio, seconds_for
from benchkit.arguments import config_options, names
from benchkit.report import print_table, write_results
from framework.models.build import build_model
from framework.common.paths import CONF_DIR
from framework.training.speedups import apply_speedups

SAMPLE = (1, 28, 28)  # Fashion-MNIST
VARIANTS = {
    "plain": {},
    "channels_last": {"channels_last": True},
    "compile": {"compile": True},
    "compile+channels_last": {"compile": True, "channels_last": True},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="lenet,simple_cnn", help="comma list of conf/model/ options")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=50, help="timed steps per round")
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    names(p, "--models", args.models, config_options("model"))
    names(p, "--variants", args.variants, VARIANTS)
    return args


class TrainingStep:
    def __init__(self, model_name: str, flags: dict, batch_size: int):
        torch.manual_seed(0)
        plain = build_model(OmegaConf.load(CONF_DIR / "model" / f"{model_name}.yaml"), SAMPLE, 10)
        model = copy.deepcopy(plain)
        self.model = apply_speedups(model, bool(flags.get("channels_last")), torch.device("cpu"),
                                    compiled=[model] if flags.get("compile") else ())
        self.channels_last = bool(flags.get("channels_last"))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.raw = torch.randint(0, 256, (batch_size, *SAMPLE), dtype=torch.uint8)
        self.labels = torch.randint(0, 10, (batch_size,))

    def __call__(self) -> None:
        x = (self.raw.float() / 255 - 0.2860) / 0.3530
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        loss = F.cross_entropy(self.model(x), self.labels)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def main() -> None:
    args = parse_args()
    variant_names = args.variants.split(",")
    results, rows = {}, []
    for model_name in args.models.split(","):
        print(f"{model_name}: building and warming up {', '.join(variant_names)}", flush=True)
        steps, first_step = {}, {}
        for name in variant_names:
            steps[name] = TrainingStep(model_name, VARIANTS[name], args.batch_size)
            first_step[name] = seconds_for(steps[name], 1)
            seconds_for(steps[name], args.warmup_steps)
        samples = alternate_steps_per_sec(steps, args.steps, args.repeats)
        plain = median_of(samples.get("plain", []), "steps_per_sec")
        results[model_name] = {}
        for name in variant_names:
            median_rate = median_of(samples[name], "steps_per_sec")
            results[model_name][name] = {
                "steps_per_sec": median_rate, "samples_per_sec": median_rate * args.batch_size,
                "speedup_over_plain": ratio(median_rate, plain), "first_step_seconds": first_step[name],
                "samples": samples[name],
            }
            rows.append([model_name, name, median_rate * args.batch_size, ratio(median_rate, plain), first_step[name]])
    print()
    print(f"{torch.get_num_threads()} threads, batch {args.batch_size}")
    print_table(["model", "variant", "samples/s", "x plain", "first step s (compile)"], rows)
    write_results("speedups", vars(args), results)


if __name__ == "__main__":
    main()
