"""A run verify.py starts: `python -m framework.verify.tethered <verify.py's pid> <train.py's arguments>` is train.py's
command in a process that ends as soon as verify.py does, however verify.py ends (SIGKILL included).

Its workers then end with it: an elastic worker watches its driver (framework/launch/elastic.py), and the worker
template and the resource tracker end once the workers are gone, as with a SIGKILLed train.py. The same lifeline
(framework/session/lifeline.py), one level up: verify.py holds no agent that could stop its runs once it is gone."""
from __future__ import annotations

import os
import signal
import sys

from framework.cli import main as train
from framework.session.lifeline import end_with


def main() -> None:
    # verify.py gone before this (its imports take seconds): end_with ends this process at once
    end_with(int(sys.argv.pop(1)), _end_now)
    train()


def _end_now() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # nobody is left to report to; the run's complete checkpoints stay


if __name__ == "__main__":
    main()
