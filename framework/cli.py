"""The commands: `hydra-dist [overrides]` (installed) and `python train.py [overrides]` train; `hydra-dist-eval` and
`python eval.py ckpt_path=...` evaluate; `hydra-dist-sample` and `python sample.py ckpt_path=...` generate text. Hydra apps, so they take the same overrides, -m sweeps, --cfg job, --help
and -sc (shell completion)."""
from __future__ import annotations

import os
import signal
import sys

import hydra
from hydra.errors import ConfigCompositionException, HydraException
from omegaconf import DictConfig
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

import framework.config  # noqa: F401  (registers the config schemas Hydra composes with)
from framework.config.hydra_versions import main_options
from framework.config.typed import missing_key_reason, omegaconf_error_line
from framework.evaluate import eval_main as evaluate
from framework.follower import follow_rank0
from framework.launch.outer import publish_to_followers, published
from framework.process.clean_exit import exit_now, quick_exit
from framework.process.environment import (env_rank, import_path_for_children, launched_externally,
                                           take_local_rank_argument)
from framework.process.slurm import adopt_scheduler_ranks
from framework.paths import CONF_DIR
from framework.run import exit_stopped_sweep, run
from framework.sample import sample_main as generate


@hydra.main(config_path=str(CONF_DIR), config_name="config", **main_options())
def train_app(cfg: DictConfig):
    return run(cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="eval", **main_options())
def eval_app(cfg: DictConfig):
    return evaluate(cfg)


@hydra.main(config_path=str(CONF_DIR), config_name="sample", **main_options())
def sample_app(cfg: DictConfig):
    generate(cfg)


def sample_main() -> None:
    """`hydra-dist-sample` / `python sample.py`: text from a trained language model (framework/sample.py)."""
    _single_process_command(sample_app)


def eval_main() -> None:
    """`hydra-dist-eval` / `python eval.py`: a trained model on the test split (framework/evaluate.py)."""
    _single_process_command(eval_app)


def _single_process_command(app) -> None:
    with quick_exit():
        try:
            _run_app(app)
        except HydraException as exc:
            _config_error(composition_error_line(exc), external=False)


def main() -> None:
    with quick_exit():  # see framework/process/clean_exit.py
        _main()


def _main() -> None:
    sys.argv[1:] = take_local_rank_argument(sys.argv[1:])
    adopt_scheduler_ranks()  # a SLURM/submitit task: torch's rank variables from the scheduler's, once
    external = launched_externally()
    if external and env_rank() != 0:  # a launcher's other ranks take the config and folder from rank 0
        try:
            code = follow_rank0()
        except KeyboardInterrupt:  # Ctrl-C reached every rank; rank 0 says what stopped and what is kept
            code = 128 + signal.SIGINT
        exit_now(code)  # see framework/process/clean_exit.py
    try:
        with import_path_for_children():  # a sweep's submitit tasks are fresh interpreters: they run this code too
            _run_app(train_app)
    except HydraException as exc:  # composing the config failed: a bad override, an unknown option, a wrong type
        _config_error(composition_error_line(exc), external)
    except KeyboardInterrupt:  # in a sweep's driver (a job run here says its own: framework/run.py)
        exit_stopped_sweep(signal.SIGINT)
        raise
    if external:  # rank 0 under torchrun/SLURM/horovodrun, run finished (errors leave through sys.exit above)
        exit_now(0)


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
    cause = exc.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        if isinstance(exc, ConfigCompositionException) and isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            return f"Could not override '{cause.full_key}': {missing_key_reason(cause)}"
        return omegaconf_error_line(cause)
    text = str(exc).split("Config search path:")[0]  # Hydra lists its search path after the options
    return " ".join(text.split()) or type(exc).__name__


def _config_error(line: str, external: bool) -> None:
    print(f"error: {line}", file=sys.stderr, flush=True)
    if external and not published():  # the other ranks wait for rank 0's payload: tell them instead
        publish_to_followers(error=line)
    sys.exit(2)


if __name__ == "__main__":
    main()
