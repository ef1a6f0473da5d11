"""The commands: `hydra-dist [overrides]` (installed) and `python train.py [overrides]` train; `hydra-dist-eval` and
`python eval.py ckpt_path=...` evaluate; `hydra-dist-sample` and `python sample.py ckpt_path=...` generate text; `hydra-dist-verify` and `python verify.py
[overrides]` compare a run with one process. Hydra apps, so they take the same overrides, -m sweeps, --cfg job, --help
and -sc (shell completion)."""
from __future__ import annotations

import os
import re
import signal
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

import framework.config  # noqa: F401  (registers the config schemas Hydra composes with)
from framework.common.errors import ConfigError, RefusedInHydra
from framework.common.paths import CONF_DIR
from framework.config.custom_entry import deletion_hint
from framework.config.hydra_versions import main_options
from framework.config.path_overrides import quoted_paths, quoting_hint
from framework.config.typed import missing_key_reason, omegaconf_error_line
from framework.launch.template import EarlyTemplate, starts_workers_from_template, stop_worker_template
from framework.session.detect import detect, sweep_driver
from framework.session.environment import import_path_for_children, take_local_rank_argument
from framework.session.exit import quick_exit
from framework.session.situations import refuse

# This module imports no torch: the commands' own modules (which do) are imported once Hydra composed the config, and
# train.py's after the workers' template started (tests/runs/test_startup_imports.py).


@hydra.main(config_path=str(CONF_DIR), config_name="config", **main_options())
def train_app(cfg: DictConfig):
    session = detect(HydraConfig.get())
    direct = session.ranks is None and not session.in_sweep
    if direct and starts_workers_from_template(cfg.strategy):
        EarlyTemplate(cfg.strategy)  # its ~4 s of imports run beside the driver's torch and checks
    try:
        from framework.run import run  # torch with it: after the template started

        return run(cfg, session)
    finally:
        if direct:  # refused, stopped or done: this process ends, and nothing of the run is left
            stop_worker_template()


@hydra.main(config_path=str(CONF_DIR), config_name="eval", **main_options())
def eval_app(cfg: DictConfig):
    from framework.evaluate import evaluate_command  # torch with it: imported once composed

    return evaluate_command(cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="sample", **main_options())
def sample_app(cfg: DictConfig):
    from framework.sample import sample_command  # torch with it: imported once composed

    sample_command(cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="verify", **main_options())
def verify_app(cfg: DictConfig):
    from framework.verify.command import verify_command  # torch with it: imported once composed

    verify_command(cfg)


def verify_main() -> None:
    """`hydra-dist-verify` / `python verify.py`: the run under its strategy against one process (framework/verify/)."""
    _single_process_command(verify_app)


def sample_main() -> None:
    """`hydra-dist-sample` / `python sample.py`: text from a trained language model (framework/sample.py)."""
    _single_process_command(sample_app)


def eval_main() -> None:
    """`hydra-dist-eval` / `python eval.py`: a trained model on the test split (framework/evaluate.py)."""
    _single_process_command(eval_app)


def _single_process_command(app) -> None:
    with quick_exit():
        try:
            sys.argv[1:] = quoted_paths(sys.argv[1:])  # ckpt_path=<sweep>/1_tp=2 (framework/config/path_overrides.py)
            _run_app(app)
        except HydraException as exc:
            refuse(ConfigError(composition_error_line(exc)))
        except RefusedInHydra as exc:  # the output folder cannot be made
            refuse(exc.error)


def main() -> None:
    with quick_exit():  # see framework/session/exit.py
        _main()


def _main() -> None:
    try:
        sys.argv[1:] = quoted_paths(take_local_rank_argument(sys.argv[1:]))
        session = detect()  # how this process was started (framework/session/), read once
    except ConfigError as exc:  # every rank meets these alike (its own arguments, its scheduler's variables)
        refuse(exc)
    if session.follows:  # the other ranks of torchrun/SLURM/horovodrun take the config and folder from rank 0
        from framework.run import train_as_follower  # torch with it: a follower needs no template

        try:
            train_as_follower(session)
        except KeyboardInterrupt:  # Ctrl-C reached every rank; rank 0 says what stopped and what is kept
            session.stopped(signal.SIGINT)
        session.finish()
    try:
        with import_path_for_children():  # a sweep's submitit tasks are fresh interpreters: they run this code too
            _run_app(train_app)
    except HydraException as exc:  # composing the config failed: a bad override, an unknown option, a wrong type
        session.fail(ConfigError(composition_error_line(exc)))
    except RefusedInHydra as exc:  # the output folder cannot be made
        session.fail(exc.error)
    except KeyboardInterrupt:  # in a sweep's driver (a job run here says its own: framework/run.py)
        driver = sweep_driver()
        if driver is not None:
            driver.stopped(signal.SIGINT)
        raise
    session.finish()


def _run_app(app) -> None:
    """Hydra's app, with its composition errors raised to us (HYDRA_FULL_ERROR, Hydra's documented switch) rather
    than printed by Hydra, so that a value of the wrong type for its schema gets the same one line as any other."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    finally:
        if before is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def composition_error_line(exc: HydraException) -> str:
    """One line for a failed composition. Hydra raises ConfigCompositionException from the OmegaConf error of an
    override: a key error is an override of a key the config lacks (said as Hydra says it, with the keys there are),
    another error a value the schema refuses (the key, the value and what is allowed)."""
    if isinstance(exc, OverrideParseException):  # named, and the grammar page, whatever Hydra words around the parser
        said = " ".join(str(exc.message).split("\nSee ")[0].replace("^", "").split())
        said = re.sub(r"^Error when parsing index: \d+, string: .* out of \[.*\]\. ", "", said)  # Hydra 1.4's
        said = said.removeprefix(f"Error parsing override '{exc.override}' ")  # Hydra 1.3's words before the parser's
        return (f"Could not parse the override {exc.override!r}: {said} (the override grammar: "
                f"https://hydra.cc/docs/advanced/override_grammar/basic){quoting_hint(str(exc.override))}")
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        if isinstance(exc, ConfigCompositionException) and isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            return f"Could not override '{cause.full_key}': {missing_key_reason(cause)}"
        return omegaconf_error_line(cause)
    text = " ".join(str(exc).split("Config search path:")[0].split())  # Hydra lists its search path after the options
    return f"{text}{deletion_hint(text)}" if text else type(exc).__name__


if __name__ == "__main__":
    main()
