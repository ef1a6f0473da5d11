"""python train.py [overrides]   e.g.  python train.py strategy=ddp model=lenet   (see README.md)"""
import sys

import hydra
from omegaconf import DictConfig

from framework.launch.environment import env_rank, launched_externally


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig):
    from framework.run import run

    return run(cfg)


if __name__ == "__main__":
    if launched_externally() and env_rank() != 0:
        from framework.run import follow_rank0

        sys.exit(follow_rank0(sys.argv[1:]))
    main()
