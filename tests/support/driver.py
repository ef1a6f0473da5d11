"""The driver in this process: conf/ composed with Hydra's compose API, the driver's checks (framework/run.py:
plan_run) on it, the strategy a run would build. What `python train.py` does before any worker starts, without a
process of its own (a process costs seconds on 2 cores; tests/runs/test_refusals.py runs some as real processes, for
the exit code, the one line and that no worker starts)."""
from __future__ import annotations

import contextlib
from pathlib import Path

from support.processes import REPO, pin_accelerator


def composed(*overrides: str, hydra: bool = False, config_name: str = "config", config_dir: Path | None = None):
    """conf/ composed with Hydra's compose API, as the driver composes it (config_name: eval or sample for eval.py's
    and sample.py's; config_dir: a --config-dir's groups too)."""
    from hydra import compose, initialize_config_dir

    from framework.common.paths import config_dir_override
    from framework.config.hydra_versions import version_base

    extra = [config_dir_override(str(config_dir))] if config_dir else []
    with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()):
        return compose(config_name, overrides=[*overrides, *extra], return_hydra_config=hydra)


def driver_says(overrides: list[str], run_dir: Path, config_dir: Path | None = None, outer=None) -> str:
    """The driver's verdict on these overrides, in this process: Hydra composes conf/ with the schemas, the driver
    types the config and runs every check before a worker would start, exactly as `python train.py` does. Returns
    the line `python train.py` prints after `error: `, or '' when the driver accepts the run. outer: the ranks a
    launcher started (framework.session.environment.Ranks: torchrun's, horovodrun's), as rank 0 sees them."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    from framework.cli import composition_error_line
    from framework.common.errors import ConfigError
    from framework.common.paths import config_dir_override
    from framework.config.hydra_versions import version_base
    from framework.run import plan_run

    extra = [config_dir_override(str(config_dir))] if config_dir else []
    try:  # checked inside the composition's context, as in a run (a refusal may list a config group's options)
        with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()), \
                _hydra_config_of(compose("config", overrides=[*pin_accelerator(list(overrides)), *extra],
                                         return_hydra_config=True)) as cfg:
            plan_run(cfg, run_dir, outer)
    except HydraException as exc:
        return composition_error_line(exc)
    except ConfigError as exc:
        return str(exc)
    return ""


@contextlib.contextmanager
def _hydra_config_of(cfg):
    """The config without its `hydra` node, with that node as HydraConfig while the driver checks it, as Hydra's
    run sets it (a refusal says which entry a key came from: framework/config/origins.py); then as it was."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    before = HydraConfig.instance().cfg
    HydraConfig.instance().set_config(cfg)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    try:
        yield cfg
    finally:
        HydraConfig.instance().cfg = before


def strategy_for(*overrides: str, ranks=None):
    """The strategy a run of these overrides would build (strategy=auto resolved for this machine), not set up, in a
    process with these ranks (framework.session.environment.Ranks; None: nobody started it as one of several)."""
    from framework.config.settings import settings_of
    from framework.strategies import build_strategy, resolve_auto, strategy_class

    cfg = composed(*overrides)
    resolve_auto(cfg, outer_kind=None)
    settings = settings_of(cfg, strategy_class(cfg.strategy).Options)
    return build_strategy(settings.strategy, settings.trainer, ranks)


def composition_says(*overrides: str) -> str:
    """The one line `python train.py` prints for a config Hydra refuses to compose ('' when it composes)."""
    from hydra.errors import ConfigCompositionException

    from framework.cli import composition_error_line

    try:
        composed(*overrides)
    except ConfigCompositionException as exc:
        return composition_error_line(exc)
    return ""


def command_in_process(command: str, argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """A command (framework.cli's main, eval_main or sample_main) run in this process as `python <argv>` runs it:
    Hydra's app with its composition, the driver's checks and its refusals, up to the point a worker would start.
    For what the command refuses, without a process of its own. Returns (exit code, stdout, stderr)."""
    import contextlib
    import logging
    import sys

    from framework import cli

    # Hydra's logging setup adds handlers writing to this test's captured streams; they would outlive the capture
    for logger in (logging.root, logging.getLogger("hydra")):
        monkeypatch.setattr(logger, "handlers", list(logger.handlers))
        monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.chdir(cwd)
    # sample.py has no trainer group: its own `accelerator` key is the test's to give
    monkeypatch.setattr(sys, "argv", [argv[0], *(argv[1:] if command == "sample_main" else pin_accelerator(argv[1:]))])
    monkeypatch.setattr(cli, "quick_exit", contextlib.nullcontext)  # its exit handler would end pytest's process
    capsys.readouterr()
    code = 0
    try:
        getattr(cli, command)()
    except SystemExit as ended:
        code = ended.code if isinstance(ended.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err
