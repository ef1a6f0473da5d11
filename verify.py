"""python verify.py [the same overrides as train.py]   e.g.  python verify.py strategy=ddp model=lenet

Trains a few steps under the strategy and under one process and compares them (docs/verify.md). The same as the
installed `hydra-dist-verify`."""
from framework.cli import verify_main

if __name__ == "__main__":
    verify_main()
