"""Why a run on several workers can differ from one process, each as an experiment: what to switch off, in the
strategy's run only or in both, and what it means when that closes the gap. Only the candidates the run has are
tried (a model without BatchNorm cannot differ by its statistics); random draws in training mode are always tried,
since a forward may draw without any module saying so.

What is not a candidate, and why: the data split. hydra-dist deals each step's global batch out of one permutation
(DistributedSampler with drop_last, the same for every world size; a stream in blocks of a micro-batch), so every step
trains one process's samples and nothing is padded (framework/data/loaders.py). A dataset that shards itself reads
the rank, and code of the user's that reads the rank or the world size cannot be switched off from outside: when no
experiment closes the gap, the report says so with the table."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from framework.callbacks.switch_off import BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS
from framework.data.streams import shards_itself

SWITCH = "verify_switch_off"  # the callback's name in the runs' callbacks group


def switched_off(what: str) -> list[str]:
    """The overrides that add framework/callbacks/switch_off.py's callback to a run."""
    return [f"+callbacks.{SWITCH}._target_=framework.callbacks.switch_off.SwitchOff",
            f"+callbacks.{SWITCH}.what={what}"]


@dataclass(frozen=True)
class Candidate:
    key: str  # the experiment's folder under verify/
    name: str  # what the verdict names
    experiment: str  # what the experiment's runs change, in words
    strategy_only: list[str] = field(default_factory=list)  # overrides of the strategy's run
    both: list[str] = field(default_factory=list)  # overrides of both runs
    found: str = ""  # what it means when switching it off closes the gap


def _names(modules: list[tuple[str, nn.Module]], most: int = 4) -> str:
    shown = ", ".join(name or type(m).__name__ for name, m in modules[:most])
    return shown + (f" and {len(modules) - most} more" if len(modules) > most else "")


EXACT_KERNELS = ["+callbacks.verify_exact_kernels._target_=framework.callbacks.exact_kernels.ExactKernels"]


def candidates(model: nn.Module, options, strategy_name: str, precision: str, augment, cuda: bool = False
               ) -> list[Candidate]:
    """The experiments for this run, in the order they are tried. `options`: the strategy's typed options; cuda:
    whether the runs train on GPUs."""
    found = []
    norms = [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm)]
    # the mesh's DDP has sync_batchnorm; its other meshes refuse it
    offered = hasattr(options, "sync_batchnorm") and getattr(options, "runs_ddp", True)
    if norms and not (offered and options.sync_batchnorm):
        where = f"BatchNorm with per-rank statistics ({_names(norms)})"
        each = ("each rank normalized with the mean and variance of its own micro-batch, one process with the whole "
                "batch's")
        if offered:
            found.append(Candidate(
                "sync_batchnorm", where, "strategy.sync_batchnorm=true in the strategy's run (BatchNorm's statistics "
                "over every rank)",
                strategy_only=["strategy.sync_batchnorm=true"],
                found=f"{each}; with strategy.sync_batchnorm=true the gap closes: train with it"))
        else:
            found.append(Candidate(
                "batchnorm_statistics", where, "BatchNorm's running statistics instead of the batch's, in both runs",
                both=switched_off(BATCHNORM_STATISTICS),
                found=f"{each}; strategy={strategy_name} has no strategy.sync_batchnorm, so that is expected here; "
                      "strategy=ddp strategy.sync_batchnorm=true, or a normalization that does not use the batch "
                      "(GroupNorm, LayerNorm), trains as one process does"))
    dropout = [(n, m) for n, m in model.named_modules() if isinstance(m, _DropoutNd) and m.p > 0]
    drawn = (f"dropout ({_names(dropout)}: p={', '.join(sorted({f'{m.p:g}' for _, m in dropout}))})" if dropout
             else "a random draw in training mode (no Dropout module: functional dropout or noise the forward draws)")
    found.append(Candidate(
        "training_mode_draws", drawn, "every module but the normalization layers in evaluation mode (no dropout, no "
        "draw in training mode), in both runs", both=switched_off(TRAINING_MODE_DRAWS),
        found="each rank draws its own masks for its own micro-batch, one process one mask for the whole batch: "
              "the same randomness, other numbers. Expected: the runs train equally well, not identically; with it "
              "off the gap closes"))
    if augment is not None:
        found.append(Candidate(
            "no_augment", "per-rank augmentation (dataset.augment)", "dataset.augment=null in both runs",
            both=["dataset.augment=null"],
            found="each rank draws its crops and flips from a generator seeded with its rank, so a sample is "
                  "augmented otherwise than in one process. Expected: equally random, other numbers; without it the "
                  "gap closes"))
    if cuda:
        found.append(Candidate(
            "exact_kernels", "the GPU's choice of kernels (TF32, cuDNN's timed and non-deterministic algorithms)",
            "TF32 off, cuDNN deterministic and untimed (benchmark off), in both runs",
            both=EXACT_KERNELS,
            found="cuDNN's convolutions run TF32 by default and pick their algorithms per batch shape, so a rank's "
                  "micro-batch and one process's batch round otherwise from step 1 on. Expected: the runs train "
                  "equally well; with exact kernels the gap closes (and each step is slower)"))
    if precision != "fp32":
        found.append(Candidate(
            "fp32", f"{precision} rounding", "trainer.precision=fp32 in both runs",
            both=["trainer.precision=fp32"],
            found=f"{precision} rounds at other points when the batch is split (each rank's partial sums, the "
                  f"all-reduce's order). Expected: the gap is {precision}'s own size; in fp32 the gap closes"))
    return found


def together(tried: list[Candidate]) -> Candidate:
    """Every candidate switched off at once: the last experiment when none closed the gap alone."""
    return Candidate("all_candidates", " and ".join(c.name for c in tried), "all of them at once",
                     strategy_only=[o for c in tried for o in c.strategy_only],
                     both=_merged([c.both for c in tried]),
                     found="together they make the difference; each alone closes only part of it: " +
                           "; ".join(f"{c.name}: {c.found}" for c in tried))


def _merged(override_lists: list[list[str]]) -> list[str]:
    """Overrides of several candidates; two switch_off callbacks become one per kind, under its own name."""
    merged, whats = [], []
    for overrides in override_lists:
        for o in overrides:
            if o.startswith(f"+callbacks.{SWITCH}.what="):
                whats.append(o.split("=", 1)[1])
            elif not o.startswith(f"+callbacks.{SWITCH}."):
                merged.append(o)
    for what in whats:
        merged += [o.replace(f"callbacks.{SWITCH}", f"callbacks.{SWITCH}_{what}") for o in switched_off(what)]
    return merged


def left_over(world_size: int, one_losses: list[float], strategy_losses: list[float], train) -> list[str]:
    """What the report can say when no experiment closed the gap: what the first step measured, and what is not
    among the candidates."""
    lines = []
    if one_losses and strategy_losses and one_losses[0] != strategy_losses[0]:
        ratio = strategy_losses[0] / one_losses[0] if one_losses[0] else float("inf")
        said = (f"step 1 already differs: the same weights on the same samples gave another loss "
                f"({strategy_losses[0]:.6f} against {one_losses[0]:.6f}, {ratio:.4f} times)")
        for name, factor in (("the number of workers", world_size), ("1 / the number of workers", 1 / world_size)):
            if world_size > 1 and abs(ratio - factor) <= 1e-4 * factor:
                said += f", which is {name} ({world_size})"
        lines.append(said)
    if shards_itself(train):
        lines.append("the training split shards itself over the ranks (each rank reads its own samples), so a step's "
                     "samples are not one process's")
    lines.append("not among the candidates: code of your own that reads the rank or the world size (a loss scaled "
                 "by it, a branch on the rank, a dataset that shards itself), or a defect of hydra-dist; the table "
                 "is the evidence for a bug report")
    return lines
