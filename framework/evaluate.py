"""`python eval.py ckpt_path=<run folder or checkpoint> [dataset=... strategy=...]` (`hydra-dist-eval`): a trained
model on the test split, with any strategy, the metrics printed and written to eval.json in the evaluation's own
folder (outputs/evals/...), as lightning-hydra-template's eval.py does.

ckpt_path is a run folder (its weights/best.safetensors or .pt, else weights/last.*, else its newest checkpoint), a
weights file (weights/*.safetensors or *.pt), or a checkpoint (a .pt, or a sharded checkpoint's folder, which only the strategy that wrote it
reads). The model, dataset, loss, metrics and step are the run's own (its resolved_config.yaml) unless the command
line names them: `dataset=...` evaluates the run's model on another dataset.

A run folder is data, not code: the `_target_`s of the run's groups are built only when they are the framework's,
torch's, torchvision's, torchmetrics' or an engine's, what this command composed itself, or match this command's
allowed_targets (framework/config/targets.py); anything else is refused, before it is imported or any worker starts."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from framework.checkpoints.store import Checkpoint, find_checkpoint, load_checkpoint
from framework.checkpoints.weights import WEIGHTS_DIR, find_weights, read_weights
from framework.config.settings import Settings, settings_of
from framework.common.errors import ConfigError, on_one_line
from framework.config.targets import TargetAllowlist, allowing
from framework.assemble import RunContext, assemble_task, loop_data, parallelize
from framework.launch.elastic import WorkersFailed
from framework.launch.template import stop_worker_template
from framework.preflight import check_world_size
from framework.results.sweep_resume import RESOLVED_CONFIG
from framework.session.detect import detect
from framework.session.environment import Ranks
from framework.session.situations import refuse
from framework.strategies import build_strategy, choose_strategy
from framework.training.determinism import NoDeterministicKernel, deterministic_environment, raise_explained
from framework.training.loop_state import EvalResult
from framework.training.interrupts import NoStop
from framework.training.trainer import evaluate

EVAL_FILE = "eval.json"
RUN_GROUPS = ("model", "dataset", "loss", "metrics", "step")  # taken from the run unless named on the command line


@dataclass
class EvalPayload:
    settings: Settings
    run_dir: str  # the evaluation's own folder
    source: str  # the weights file or checkpoint evaluated
    kind: str  # "weights" (a full state dict of the model) or "checkpoint"


def evaluate_command(cfg: DictConfig) -> float | None:
    """Hydra's task function for eval.py: one process that starts the strategy's workers itself (a direct run)."""
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    session = None
    try:
        session = detect(hydra_cfg)
        if OmegaConf.is_missing(cfg, "ckpt_path"):
            raise ConfigError("ckpt_path is missing: name a run folder, weights file or checkpoint, e.g. "
                              "python eval.py ckpt_path=outputs/runs/<run>")
        return _evaluate(cfg, out_dir, list(hydra_cfg.overrides.task), session.ranks)
    except (ConfigError, WorkersFailed) as exc:
        refuse(exc)
    except NoDeterministicKernel as exc:  # raised in this process (single, dp): one failure line, as a worker's is
        refuse(WorkersFailed(str(exc)))
    finally:
        if session is not None and session.ranks is None and not session.in_sweep:
            stop_worker_template()  # the one its strategy's starter started: nothing of the command is left


def _evaluate(cfg: DictConfig, out_dir: Path, overrides: list[str], ranks: Ranks | None) -> float:
    trusted = TargetAllowlist.of_command(cfg)  # this command's own config, before the run's groups come in
    with allowing(trusted):
        return _evaluate_trusting(trusted, cfg, out_dir, overrides, ranks)


def _evaluate_trusting(trusted: TargetAllowlist, cfg: DictConfig, out_dir: Path, overrides: list[str],
                       ranks: Ranks | None) -> float:
    source, kind, run_dir = resolve_source(cfg.ckpt_path)
    if run_dir is not None:
        take_run_groups(cfg, run_dir / RESOLVED_CONFIG, overrides)
        for group in RUN_GROUPS:  # every _target_ the run folder brings, by name, before anything imports it
            if group in cfg:
                trusted.check(OmegaConf.to_container(cfg[group], resolve=True), group)
    strategy_class, note = choose_strategy(cfg, outer=None)
    settings = settings_of(cfg, strategy_class.Options, dataset_as_written=run_dir is None, targets=trusted)
    strategy = strategy_class(settings.strategy, settings.trainer.engine(), ranks=ranks)
    strategy.validate()
    if kind == "checkpoint" and source.is_dir():
        manifest = json.loads(source.with_suffix(".json").read_text())
        saved = manifest.get("format")
        if saved not in strategy.checkpoint_format.readable:
            raise ConfigError(f"ckpt_path={source} is not allowed with strategy={strategy.name}: it holds {saved} shards; "
                              "evaluate it with the strategy that wrote it, or give the run's weights/*.pt")
        check_world_size(f"ckpt_path={source}", source, manifest, strategy,
                         "evaluate the run's weights/*.pt (the whole model, on any number of workers)")
    if note:
        print(note, flush=True)
    payload = EvalPayload(settings, str(out_dir), str(source), kind)
    result = strategy.starter.launch(evaluate_entry, payload)
    shown = " | ".join(f"test {name} {value:.4f}" for name, value in result.metrics.items())
    print(f"eval: {source} | test loss {result.loss:.4f}{' | ' + shown if shown else ''}", flush=True)
    report = {"ckpt_path": str(cfg.ckpt_path), "evaluated": str(source), "test_loss": result.loss,
              **{f"test_{name}": value for name, value in result.metrics.items()}, "metrics": list(result.metrics),
              "strategy": strategy.name, "processes": strategy.starter.processes(), "dataset": settings.dataset.display_name,
              "model": settings.model_name}
    (out_dir / EVAL_FILE).write_text(json.dumps(report, indent=2) + "\n")
    objective = settings.trainer.objective
    return result.loss if objective == "loss" else result.metrics.get(objective, result.loss)


def resolve_source(ckpt_path) -> tuple[Path, str, Path | None]:
    """(what to load, "weights" or "checkpoint", the run folder it belongs to or None)."""
    if ckpt_path in (None, "", "???"):
        raise ConfigError("ckpt_path is missing: give a run folder, a weights file (weights/*.pt) or a checkpoint")
    path = Path(str(ckpt_path))
    if not path.exists():
        raise ConfigError(f"ckpt_path={path} is not allowed: no such file or folder")
    if path.is_dir() and (path / RESOLVED_CONFIG).is_file():  # a run folder
        weights = find_weights(path, ("best", "last"))  # safetensors first: no pickle at all
        if weights is not None:
            return weights, "weights", path
        checkpoint = find_checkpoint(path, warn=lambda m: print(f"warning: {m}", flush=True), key="ckpt_path")
        return checkpoint.path, "checkpoint", path
    run = _run_folder_of(path)
    if path.is_file() and path.parent.name == WEIGHTS_DIR:
        return path, "weights", run
    checkpoint = find_checkpoint(path, warn=lambda m: print(f"warning: {m}", flush=True), key="ckpt_path")
    return checkpoint.path, "checkpoint", run


def _run_folder_of(path: Path) -> Path | None:
    for parent in path.resolve().parents:
        if (parent / RESOLVED_CONFIG).is_file():
            return parent
    return None


def take_run_groups(cfg: DictConfig, resolved: Path, overrides: list[str]) -> None:
    """The run's model, dataset, loss, metrics and step, for each one the command line does not choose anew
    (`dataset=mnist`); its keys named on the command line (`dataset.max_test_samples=256`) go over the run's."""
    run_cfg = OmegaConf.load(resolved)
    chosen = {o.lstrip("+").split("=", 1)[0] for o in overrides if "=" in o}
    with open_dict(cfg):
        for group in RUN_GROUPS:
            if group in chosen:
                continue
            if group not in run_cfg:  # the run left it out (~metrics: a causal LM scored by its loss alone)
                cfg.pop(group, None)
                continue
            keys = [o.lstrip("+").removeprefix(f"{group}.") for o in overrides if o.lstrip("+").startswith(f"{group}.")]
            cfg[group] = OmegaConf.merge(run_cfg[group], OmegaConf.from_dotlist(keys))


def evaluate_entry(payload: EvalPayload, ranks: Ranks | None) -> EvalResult | None:
    """Every worker of an evaluation (with the ranks its starter gave it): build the run's task, load the weights,
    evaluate; rank 0 returns the result."""
    with allowing(payload.settings.targets):
        return _evaluate_worker(payload, ranks)


def _evaluate_worker(payload: EvalPayload, ranks: Ranks | None) -> EvalResult | None:
    settings = payload.settings
    deterministic_environment(settings.trainer.deterministic)  # before join() starts CUDA in this process
    strategy = build_strategy(settings.strategy, settings.trainer, ranks)
    group = strategy.join()
    wrapped = None
    try:
        ctx = RunContext(settings=settings, strategy=strategy, group=group, ranks=ranks, run_dir=Path(payload.run_dir),
                         say=_unsaid, stop=NoStop())
        task = assemble_task(ctx)
        source = Path(payload.source)
        sharded = payload.kind == "checkpoint" and source.is_dir()
        if not sharded:  # a full state dict goes into the plain model, before any wrapper shards it
            state = read_weights(source) if payload.kind == "weights" else load_checkpoint(_checkpoint(source))
            _load(task.model, state["model"], source)
        wrapped = parallelize(ctx, task)
        if sharded:
            wrapped.checkpoint_io.load_shards(source.parent, source.name, wrapped.model, wrapped.optimizer)
        result = evaluate(group, wrapped, loop_data(ctx, task))
        return result if group.is_main else None
    except RuntimeError as exc:  # an op without a deterministic kernel: torch's message and the key's line
        raise_explained(exc, settings.trainer.deterministic)
    finally:
        if wrapped is not None:
            wrapped.close()
        group.leave(wait_for_peers=False)


def _unsaid(line: str) -> None:
    """An evaluation's workers say nothing: the driver prints the result."""


def _checkpoint(path: Path) -> Checkpoint:
    return Checkpoint(path, json.loads(path.with_suffix(".json").read_text()))


def _load(model, state: dict, source: Path) -> None:
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ConfigError(f"ckpt_path={source} does not fit the model: {on_one_line(exc)[:400]}") from None

