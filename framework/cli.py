"""The training command: `hydra-dist [overrides]` (installed) and `python train.py [overrides]` run this.

One Hydra app, so both take the same overrides, -m sweeps, --cfg job, --help and -sc (shell completion)."""
from __future__ import annotations

import signal
import sys

import hydra
from omegaconf import DictConfig

from framework.launch.clean_exit import exit_now
from framework.launch.environment import env_rank, launched_externally, take_local_rank_argument
from framework.paths import CONF_DIR


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def train_app(cfg: DictConfig):
    from framework.run import run

    return run(cfg)


def main() -> None:
    sys.argv[1:] = take_local_rank_argument(sys.argv[1:])
    if launched_externally() and env_rank() != 0:  # a launcher's other ranks take config and folder from rank 0
        from framework.launch.outer import follow_rank0

        try:
            code = follow_rank0(sys.argv[1:])
        except KeyboardInterrupt:  # Ctrl-C reached every rank; rank 0 says what stopped and what is kept
            code = 128 + signal.SIGINT
        exit_now(code)  # see framework/launch/clean_exit.py
    train_app()
    if launched_externally():  # rank 0 under torchrun/SLURM/horovodrun, run finished (errors leave through sys.exit above)
        exit_now(0)


if __name__ == "__main__":
    main()
