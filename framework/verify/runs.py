"""The runs verify.py compares: train.py itself (the same command, as a process of its own that ends with verify.py:
framework/verify/tethered.py), with the user's overrides and a few of verify's, each in its own folder under
verify/. The strategy's run starts its workers the way the strategy does (torch's elastic agent, Horovod's runner,
in-process), as `python train.py` would."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from framework.session.environment import import_path_for_children
from framework.session.situations import REFUSED

# keys verify.py sets in every run (a user's own value of them is replaced), and the strategy's
SET_BY_VERIFY = ("trainer.eval_every_n_steps", "trainer.log_every_n_steps", "trainer.progress_bar", "hydra.run.dir",
                 "callbacks.verify_stop")
STRATEGY_KEYS = ("strategy",)


def key_of(override: str) -> str:
    """The key an override sets (`+a.b=1`, `~a.b`, `a=x,y` -> a.b / a)."""
    return override.lstrip("+~").split("=", 1)[0]


def without(overrides: list[str], keys: tuple[str, ...]) -> list[str]:
    """The overrides that set none of `keys` nor a key under them."""
    return [o for o in overrides if not any(key_of(o) == k or key_of(o).startswith(k + ".") for k in keys)]


def one_process(overrides: list[str]) -> list[str]:
    """The one-process run's overrides: the user's with strategy=single for any strategy and its options; the global
    batch, seed, data and precision are trainer and dataset keys, so they stay."""
    return [*without(overrides, STRATEGY_KEYS), "strategy=single"]


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the current folder when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def first_steps(steps: int) -> list[str]:
    """The run's first `steps` steps, its schedule the whole run's (framework/callbacks/stop_after.py)."""
    return [f"trainer.eval_every_n_steps={steps}",
            "+callbacks.verify_stop._target_=framework.callbacks.stop_after.StopAfter",
            f"+callbacks.verify_stop.step={steps}"]


class RunFailed(Exception):
    """A run of the comparison did not finish: its command's exit code and its error line."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


@dataclass
class Runner:
    """Starts the comparison's runs: `config_options` (--config-dir, --config-name) and the user's overrides, the
    verify keys taken out; each run's first `steps` steps, the loss logged at every step."""

    folder: Path  # verify/ in the command's run folder
    config_options: list[str]
    overrides: list[str]
    steps: int
    environment: dict[str, str]  # what every run shares beside its overrides (framework/verify/shared.py)
    say: object = print

    def train(self, name: str, overrides: list[str]) -> Path:
        """Train one run into verify/<name>; its output into verify/<name>.log. Returns its folder."""
        run_dir = self.folder / name
        log = run_dir.with_name(run_dir.name + ".log")
        log.parent.mkdir(parents=True, exist_ok=True)
        args = [*self.config_options, *without(overrides, SET_BY_VERIFY), *first_steps(self.steps),
                "trainer.log_every_n_steps=1", "trainer.progress_bar=false", f"hydra.run.dir={run_dir}"]
        started = time.monotonic()
        with open(log, "w") as out, import_path_for_children():  # the runs import this process's framework
            run = subprocess.Popen([sys.executable, "-m", "framework.verify.tethered", str(os.getpid()), *args],
                                   stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.environment})
            try:
                code = run.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the run too: it stops its workers, then this command stops
                run.wait()
                raise
        if code != 0:
            raise RunFailed(_failure(name, code, log), code)
        self.say(f"verify: {name} trained in {time.monotonic() - started:.1f} s ({shown(run_dir)})")
        return run_dir


def _failure(name: str, code: int, log: Path) -> str:
    """The run's own error line (a refusal's one line), else its output's last line, and where its log is."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    said = next((line.removeprefix("error: ") for line in reversed(lines) if line.startswith("error: ")),
                lines[-1] if lines else "no output")
    if code == REFUSED:
        return said
    return f"the {name} run failed (exit {code}): {said}; its output: {shown(log)}"


def refused(exc: RunFailed) -> bool:
    return exc.code == REFUSED

