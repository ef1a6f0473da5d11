"""python train.py [overrides]   e.g.  python train.py strategy=ddp model=lenet   (see README.md)

The same command as the installed `hydra-dist`."""
from framework.cli import main

if __name__ == "__main__":
    main()
