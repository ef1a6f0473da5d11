"""Workers that an outer launcher already started: torchrun and the launchers like it (torch.distributed.launch,
DeepSpeed's `deepspeed`), SLURM or submitit tasks, horovodrun. Rank 0 runs Hydra and drives the run; the other
ranks never run Hydra (so there is one run folder): they join rank 0's group and take the resolved config and the
run folder from it. A config error found by rank 0 reaches every rank through the same group, so all end at once."""
from __future__ import annotations

import sys

from hydra._internal.utils import get_args_parser
from omegaconf import DictConfig

from framework.errors import ConfigError
from framework.training.interrupts import NoStop
from framework.launch.environment import HOROVOD, outer_launcher
from framework.launch.slurm import scheduler_name


def launcher_name() -> str:
    """The outer launcher as a user would name it, for messages."""
    scheduler = scheduler_name()
    if scheduler:
        return {"slurm": "SLURM tasks", "local": "submitit_local tasks"}.get(scheduler, scheduler)
    return "horovodrun" if outer_launcher() == HOROVOD else "torchrun"


def multirun_refusal() -> str:
    return (f"-m/--multirun is not allowed under {launcher_name()}; run the sweep without it "
            "(for sweeps on SLURM: python train.py -m hydra/launcher=slurm ...)")


def choose_strategy(cfg: DictConfig, external: bool):
    """Resolve strategy=auto and build the strategy; under an outer launcher only a strategy that can train with the
    workers that launcher started (Strategy.outer_launchers) is allowed."""
    from framework.strategies import build_strategy, resolve_auto, strategies_for_launcher

    launcher = outer_launcher() if external else None
    note = resolve_auto(cfg, launcher)
    strategy = build_strategy(cfg)
    if launcher is not None and launcher not in strategy.outer_launchers:
        fits = ", ".join(strategies_for_launcher(launcher))
        raise ConfigError(
            f"strategy={strategy.name} is not allowed under {launcher_name()}: the launcher already started "
            f"several workers; use strategy={fits}{' or auto' if launcher != HOROVOD else ''}"
        )
    return strategy, note


def _group_link(cfg: DictConfig):
    """A strategy that only joins the launcher's process group: the channel for rank 0's config error."""
    if outer_launcher() == HOROVOD:
        from framework.strategies.horovod import HorovodStrategy

        return HorovodStrategy(cfg)
    from framework.strategies.ddp import DDPStrategy

    return DDPStrategy(cfg)


def error_through_rank0_group(cfg: DictConfig, message: str | None) -> str | None:
    """Rank 0's config error, shared over a short-lived process group: rank 0 passes its message, the
    followers pass None and get it back, so no rank waits for a payload that never comes. None if even
    that fails (the others then time out on their own)."""
    try:
        link = _group_link(cfg)
        link.setup()
        payload = link.broadcast_object(None if message is None else {"error": message})
        link.leave_group(wait_for_peers=True)  # as the followers that got it from the payload do (follow)
        return payload.get("error")
    except Exception:
        return None


def follow_rank0(argv: list[str]) -> int:
    """Ranks > 0 started by a launcher: no Hydra run (so no extra folder); config and run folder come from rank 0.
    The config is composed here only to know how to join: the same config files, --config-dir and overrides as
    rank 0 (a user's own strategy may live in their config dir)."""
    from hydra import compose, initialize_config_dir

    from framework.paths import CONF_DIR, config_dir_override

    args = get_args_parser().parse_args(argv)
    if args.multirun:
        print(f"error: {multirun_refusal()}", file=sys.stderr)
        return 2
    overrides = [o for o in args.overrides if not o.lstrip("+~").startswith("hydra.")]
    if args.config_dir:
        overrides.append(config_dir_override(args.config_dir))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(args.config_name or "config", overrides=overrides)
    return 0 if follow(cfg) is None else 2


def follow(cfg: DictConfig) -> str | None:
    """Join rank 0's group, take its payload and train as one rank. Returns the error when there is one."""
    from framework.worker import worker_entry

    try:
        strategy, _ = choose_strategy(cfg, external=True)
    except ConfigError as exc:  # torchrun and horovodrun stop rank 0 as soon as one rank fails, so say it here too
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if scheduler_name() is None:
            return str(exc)
        # SLURM/submitit stop nothing: rank 0 found the same error and waits to send it; take it so it can end.
        return error_through_rank0_group(cfg, None) or str(exc)
    strategy.setup()
    payload = strategy.broadcast_object(None)
    if "error" in payload:
        if scheduler_name():  # each SLURM/submitit task has a log of its own; under torchrun rank 0 said it
            print(f"error: {payload['error']}", file=sys.stderr, flush=True)
        strategy.leave_group(wait_for_peers=True)  # after saying it; rank 0 waits for us the same way
        return payload["error"]
    worker_entry(payload, strategy, stop=NoStop())
    return None
