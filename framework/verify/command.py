"""`python verify.py <train.py's overrides>` (`hydra-dist-verify`): is this run, on several workers, the run one
process would train? And if not, why?

It composes the config as train.py does (conf/verify.yaml is train.py's config plus verify.*), runs the driver's
checks on it (a refusal is one line, exit 2, before anything trains), then trains verify.steps steps twice with
train.py itself: under strategy=single and under the chosen strategy, with the same global batch, seed, data and
precision (the same overrides; only the strategy differs) and what the strategy's run resolves for itself (its
layout and threads: framework/verify/shared.py). It compares the loss of every step and every weight at the end
(framework/verify/verdict.py), against the rounding floor where later steps drift (framework/verify/floor.py).
Equal: exit 0. Not equal: the first step that differs, then one experiment per candidate cause
(framework/verify/causes.py): the candidate switched off, both runs again, compared again; the cause is the one whose
removal closes the gap. Exit 1, with the table when nothing closed it. Equal only up to the step where rounding alone
outgrows the tolerance: "cannot tell" from that step on, exit 1.

Everything goes into verify/ in this command's run folder: one folder per run (a train.py run folder: TensorBoard
shows the curves side by side), each run's output beside it (<name>.log), and verify.json with every comparison's
per-step numbers."""
from __future__ import annotations

import copy
import json
import signal
import sys
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

from framework.assemble import build_task
from framework.common.errors import ConfigError
from framework.config.targets import TargetAllowlist, allowing
from framework.config.typed import typed
from framework.config.verify import VerifyConfig
from framework.results.result_file import read_result
from framework.run import plan_run
from framework.session.detect import detect
from framework.session.situations import Job, refuse
from framework.strategies import choose_strategy
from framework.strategies.single import SingleStrategy
from framework.verify.causes import Candidate, candidates, left_over, together
from framework.verify.compare import compare_runs, floor_of
from framework.verify.floor import floor_run
from framework.verify.runs import RunFailed, Runner, key_of, one_process, refused, shown, without
from framework.verify.shared import shared_with_strategy
from framework.verify.verdict import CANNOT_TELL, EQUAL, Comparison, Floor

VERIFY_DIR = "verify"
VERIFY_FILE = "verify.json"
NOT_EQUAL = 1


def verify_command(cfg: DictConfig) -> None:
    """Hydra's task function for verify.py: exit 0 when the runs are equal, 1 when not (or a run failed), 2 for a
    refusal."""
    session = detect(HydraConfig.get())
    try:
        if session.multirun:
            raise ConfigError("-m/--multirun is not allowed with verify.py: it compares one configuration with one "
                              "process; run it once per configuration")
        if session.ranks is not None:
            raise ConfigError(f"verify.py is not allowed under {session.ranks.started_by}: it starts the runs it "
                              "compares itself, the strategy's workers too; run `python verify.py ...` directly")
        equal = Verification(cfg, session.job).run()
    except RunFailed as exc:
        refuse(ConfigError(str(exc)) if refused(exc) else exc)
    except ConfigError as exc:
        refuse(exc)
    except KeyboardInterrupt:
        print(f"\nstopped by SIGINT; the runs trained so far are in {shown(session.job.run_dir / VERIFY_DIR)}",
              file=sys.stderr, flush=True)
        sys.exit(128 + signal.SIGINT)
    if not equal:
        sys.exit(NOT_EQUAL)


class Verification:
    def __init__(self, cfg: DictConfig, job: Job):
        self.options = typed(VerifyConfig, cfg.get("verify") or {}, "verify")
        self.train_cfg = _without_verify(cfg)
        self.job = job
        self.folder = job.run_dir / VERIFY_DIR
        self.comparisons: list[tuple[str, Comparison]] = []
        self.floors: dict[Path, Floor] = {}

    def prepare(self) -> None:
        """Everything before the first run: verify.py's refusals and train.py's (one line, exit 2), the model and data
        the run builds (its candidates), and what every run takes from the strategy's (framework/verify/shared.py)."""
        resume = self.train_cfg.trainer.get("resume")
        if resume not in (None, "auto", "none"):
            raise ConfigError(f"trainer.resume={resume} is not allowed with verify.py: it compares two runs from the "
                              "same start; leave trainer.resume out")
        asked = self.train_cfg.strategy.get("name")
        with allowing(TargetAllowlist.of_command(self.train_cfg)):
            chosen, _ = choose_strategy(self.train_cfg, None)  # strategy=auto resolved, as the driver resolves it
        if issubclass(chosen, SingleStrategy):
            said = " (strategy=auto chose it on this machine)" if asked == "auto" else ""
            raise ConfigError(f"strategy={self.train_cfg.strategy.name} is not allowed with verify.py{said}: it "
                              "compares a run of several workers with one process, and this is one process; name "
                              "the strategy to check, e.g. strategy=ddp")
        strategy, payload, _ = plan_run(self.train_cfg, self.job.run_dir, None)  # every refusal of train.py, here
        self.settings = s = payload.settings
        workers_device = torch.device("cuda" if strategy.trainer.cuda else "cpu")
        with allowing(s.targets):  # the model and data this run builds, and its layout where its workers train
            self.task = build_task(s, workers_device, strategy.channels_last_refusal)
        self.name, self.shares = strategy.name, strategy.batch_shares()
        shared = shared_with_strategy(self.task.channels_last, strategy.starter.processes())
        overrides = [*without(_user_overrides(self.job), tuple(key_of(o) for o in shared.overrides)),
                     *shared.overrides]
        self.runner = Runner(self.folder, _config_options(self.job), overrides, self.options.steps,
                             shared.environment)

    def run(self) -> bool:
        self.prepare()
        s, t = self.settings, self.settings.trainer
        print(f"verify: strategy={self.name} against one process (strategy=single): {self.options.steps} steps of "
              f"global batch {t.batch_size}, seed {t.seed}, {t.precision}; the runs go to {shown(self.folder)}",
              flush=True)
        baseline = self._pair(None, None)
        result = read_result(baseline.strategy) or {}
        # its slots: ranks, or dp's replicas (one process on several GPUs)
        self.workers = len(result.get("per_rank_samples_per_sec") or []) or int(result.get("processes", 0))
        label = f"{self.name} x{self.workers}"
        if baseline.verdict in (EQUAL, CANNOT_TELL):
            if baseline.verdict == CANNOT_TELL:
                print("\n".join(baseline.table(label)), flush=True)
            self._write(None, [])
            print(f"verify: {baseline.verdict_text()}", flush=True)
            return baseline.verdict == EQUAL
        print(f"verify: {baseline.difference_text(label)}", flush=True)
        print("\n".join(baseline.table(label)), flush=True)
        cause, tried = self._experiments(candidates(self.task.model, s.strategy, self.name, t.precision,
                                                    s.dataset.augment, t.cuda_wanted), baseline)
        self._write(cause, tried)
        if cause is not None:
            print(f"verify: not equal to one process; the cause, found by experiment: {cause.name}: {cause.found}",
                  flush=True)
            return False
        processes = int(result.get("processes", 0))  # what torch.distributed's world size reads
        for line in left_over(processes, baseline.one_losses, baseline.strategy_losses, self.task.data.train):
            print(f"verify: {line}", flush=True)
        names = "; ".join(c.name for c in tried)
        print(f"verify: not equal to one process, and none of the candidates closed the gap ({names}): see the "
              f"table above and {shown(self.folder / VERIFY_FILE)}", flush=True)
        return False

    def _experiments(self, found: list[Candidate], baseline: Comparison) -> tuple[Candidate | None, list[Candidate]]:
        """Each candidate switched off in turn until one closes the gap; then all at once when none did alone."""
        tried = []
        for i, candidate in enumerate(found, 1):
            tried.append(candidate)
            print(f"verify: experiment {i} of {len(found)}: {candidate.name}? Trained again with "
                  f"{candidate.experiment}", flush=True)
            if self._closes(candidate, baseline):
                return candidate, tried
        if len(found) > 1:
            print("verify: last experiment: every candidate switched off at once", flush=True)
            every = together(found)
            if self._closes(every, baseline):
                return every, tried
        return None, tried

    def _closes(self, candidate: Candidate, baseline: Comparison) -> bool:
        """Whether the runs with the candidate switched off differ nowhere the comparison can tell, and it tells
        where the runs as configured differed."""
        compared = self._pair(candidate, baseline)
        closes = not compared.differs and compared.tells_where(baseline)
        if closes and compared.verdict == EQUAL:
            said = "closes the gap"
        elif closes:
            said = f"closes the gap where the comparison can tell, in {compared.told_text()}"
        elif compared.differs:
            said = "leaves a gap"
        else:
            said = "cannot tell where the runs as configured differed"
        print(f"verify: {candidate.key}: {said} ({compared.gaps_text()})", flush=True)
        return closes

    def _pair(self, candidate: Candidate | None, baseline: Comparison | None) -> Comparison:
        """Both runs with the candidate switched off (None: as configured); the one-process run of the baseline is
        reused when the candidate changes only the strategy's run. One process trains first: a refusal of its
        config comes before the strategy's workers start."""
        overrides, prefix = self.runner.overrides, f"{candidate.key}/" if candidate else ""
        both = candidate.both if candidate else []
        if baseline is not None and not both:
            single = baseline.one_process
        else:
            single = self.runner.train(f"{prefix}single", one_process([*overrides, *both]))
        strategy_only = candidate.strategy_only if candidate else []
        run = self.runner.train(f"{prefix}{self.name}", [*overrides, *both, *strategy_only])
        compared = compare_runs(single, run, self.options.loss_tolerance, self.options.weight_tolerance)
        if compared.needs_floor:  # the first step agrees and later ones drift: is that rounding, amplified?
            compared.floor = self._floor(single, both)
        self.comparisons.append((candidate.key if candidate else "as_configured", compared))
        return compared

    def _floor(self, single: Path, both: list[str]) -> Floor:
        """The rounding floor of a one-process run (framework/verify/floor.py), measured once per such run."""
        if single not in self.floors:
            floor = floor_run(self.task.model, self.shares, self.settings.trainer.grad_accum, both,
                              self.task.data.train)
            print(f"verify: the first step agrees and later ones drift apart: how far does rounding alone take one "
                  f"process? ({floor.what})", flush=True)
            name = single.relative_to(self.folder).with_name(floor.name)  # beside that run
            base = one_process([*self.runner.overrides, *both])
            overrides = [*without(base, tuple(key_of(o) for o in floor.overrides)), *floor.overrides]
            self.floors[single] = floor_of(single, self.runner.train(str(name), overrides), floor.what)
        return self.floors[single]

    def _write(self, cause: Candidate | None, tried: list[Candidate]) -> None:
        baseline = self.comparisons[0][1]
        record = {
            "strategy": self.name, "workers": self.workers, "steps": self.options.steps,
            "loss_tolerance": self.options.loss_tolerance, "weight_tolerance": self.options.weight_tolerance,
            "verdict": baseline.verdict, "equal": baseline.equal,
            "shared": {"overrides": [o for o in self.runner.overrides if o.startswith("trainer.channels_last=")],
                       "environment": self.runner.environment},
            "comparisons": {key: compared.to_json() for key, compared in self.comparisons},
            "tried": [{"key": c.key, "candidate": c.name, "experiment": c.experiment} for c in tried],
            "cause": None if cause is None else {"key": cause.key, "candidate": cause.name, "found": cause.found},
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / VERIFY_FILE).write_text(json.dumps(record, indent=2))
        print(f"verify: per-step numbers in {shown(self.folder / VERIFY_FILE)}; `tensorboard --logdir "
              f"{shown(self.folder)}` shows the runs' curves side by side", flush=True)


def _without_verify(cfg: DictConfig) -> DictConfig:
    """train.py's config: this command's without its own `verify` node."""
    plain = copy.deepcopy(cfg)  # Hydra's node stays as composed
    with open_dict(plain):
        plain.pop("verify", None)
    return plain


def _user_overrides(job: Job) -> list[str]:
    return [o for o in job.overrides if key_of(o) != "verify" and not key_of(o).startswith("verify.")]


def _config_options(job: Job) -> list[str]:
    """The command's --config-dir (and a --config-name of the user's own); conf/verify.yaml's name is not train.py's."""
    words, options = list(job.config_options), []
    while words:
        flag, value = words.pop(0), words.pop(0)
        if not (flag == "--config-name" and value == "verify"):
            options += [flag, value]
    return options

