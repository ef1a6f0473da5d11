"""The driver: runs once per job, in the process Hydra started. Validates, saves the resolved config,
hands the run to the strategy's launcher, and reports. Workers never run Hydra again."""
from __future__ import annotations

import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from framework.errors import ConfigError
from framework.launch.elastic import WorkersFailed
from framework.launch.environment import launched_externally
from framework.results import format_rate, write_result
from framework.strategies import build_strategy, resolve_auto
from framework.validation import validate
from framework.worker import worker_entry

RESOLVED_CONFIG = "resolved_config.yaml"


def run(cfg: DictConfig) -> float | None:
    """Hydra's task function. Returns the test accuracy (the objective for sweepers)."""
    try:
        return _drive(cfg)
    except (ConfigError, WorkersFailed) as exc:
        sys.exit(f"error: {exc}")


def prepare(cfg: DictConfig, external: bool):
    """Resolve strategy=auto, build the strategy and validate everything; no side effects."""
    note = resolve_auto(cfg, external)
    strategy = build_strategy(cfg)
    if external and strategy.name != "ddp":
        raise ConfigError(
            f"strategy={strategy.name} is not allowed under torchrun: the launcher already started several "
            "workers; use strategy=ddp (or auto)"
        )
    validate(cfg, strategy)
    return strategy, note


def _drive(cfg: DictConfig) -> float | None:
    external = launched_externally()
    hydra_cfg = HydraConfig.get()
    try:
        strategy, note = prepare(cfg, external)
    except ConfigError as exc:
        if external:
            _tell_followers_and_exit(cfg, str(exc))
        raise
    run_dir = Path(hydra_cfg.runtime.output_dir)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    OmegaConf.save(OmegaConf.create(resolved), run_dir / RESOLVED_CONFIG)
    payload = {"cfg": resolved, "run_dir": str(run_dir)}
    if note:
        print(note, flush=True)
    if external:  # we are rank 0 of workers torchrun started: share the payload, then train here
        strategy.setup()
        strategy.broadcast_object(payload)
        result = worker_entry(payload, strategy)
    else:
        result = strategy.launch(worker_entry, payload)
    if result is None:  # a node that does not hold rank 0
        print(f"done: this node's workers finished; rank 0's node reports the result. Run folder {run_dir}", flush=True)
        return None
    result.update(run_dir=str(run_dir), job=hydra_cfg.job.get("num", 0), overrides=list(hydra_cfg.overrides.task))
    write_result(run_dir, result)
    per_rank = ", ".join(format_rate(r) for r in result["per_rank_samples_per_sec"])
    print(
        f"done: test accuracy {result['test_acc']:.4f} | {format_rate(result['samples_per_sec'])} samples/s "
        f"(per rank: {per_rank}) | {result['train_seconds']:.1f} s training | run folder {run_dir}",
        flush=True,
    )
    return result["test_acc"]


def _tell_followers_and_exit(cfg: DictConfig, message: str) -> None:
    """Under torchrun, ranks > 0 wait for rank 0's payload; send them the error instead so none hangs."""
    try:
        from framework.strategies.ddp import DDPStrategy

        follower_link = DDPStrategy(cfg)
        follower_link.setup()
        follower_link.broadcast_object({"error": message})
        follower_link.teardown()
    except Exception:  # the followers time out on their own if even this fails
        pass


def follow_rank0(overrides: list[str]) -> int:
    """Ranks > 0 under torchrun: no Hydra run (so no extra folder); take config and run folder from rank 0."""
    from hydra import compose, initialize_config_dir

    from framework.paths import CONF_DIR

    if any(o in ("-m", "--multirun") for o in overrides):
        print("error: -m/--multirun is not allowed under torchrun; run the sweep without torchrun", file=sys.stderr)
        return 2
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[o for o in overrides if not o.startswith(("hydra.", "--"))])
    try:
        strategy, _ = prepare(cfg, external=True)
    except ConfigError as exc:  # torchrun stops rank 0 as soon as one rank fails, so say it here too
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    strategy.setup()
    payload = strategy.broadcast_object(None)
    if "error" in payload:
        strategy.teardown()
        return 2
    worker_entry(payload, strategy)
    return 0
