"""What a worker says on the console. Rank 0: a live progress bar (step, samples/s, loss, ETA) when stdout is a
terminal, else the plain lines (CI, SLURM logs); the run folder's train.log gets the plain lines always.
Other ranks: their plain lines only with trainer.log_all_ranks=true (the launcher prefixes them with the rank).

The bar is redrawn at log boundaries (trainer.log_every_n_steps), never per step: reading the loss
would synchronize the device."""
from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CLEAR_LINE = "\r\x1b[K"


@dataclass(kw_only=True)
class Progress:
    step: int
    total_steps: int
    epoch: int  # 1-based
    epochs: int
    loss: float
    samples_per_sec: float
    steps_per_sec: float


class Console:
    """Callable like print for one line; a line that carries a Progress may be shown as the bar instead."""

    def __init__(self, log_file: Path | None = None, bar: bool = True, quiet: bool = False, stream=None):
        self.stream = stream or sys.stdout
        self.log_file, self.quiet = log_file, quiet
        self.bar = bar and not quiet and self.stream.isatty()
        self._drawn = ""
        self._steps_per_sec = 0.0  # smoothed over intervals, for a steadier ETA

    def __call__(self, msg: str, progress: Progress | None = None) -> None:
        if self.log_file is not None:
            try:
                with open(self.log_file, "a") as f:
                    f.write(msg + "\n")
            except OSError as exc:  # disk full, folder read-only: the console goes on; a checkpoint says if the run can
                print(f"warning: {self.log_file} can no longer be written ({exc.strerror or exc}); lines go to the "
                      "console only", file=self.stream, flush=True)
                self.log_file = None
        if self.quiet:
            return
        if not self.bar:
            print(msg, file=self.stream, flush=True)
            return
        if progress is not None:
            rate = progress.steps_per_sec
            self._steps_per_sec = 0.7 * self._steps_per_sec + 0.3 * rate if self._steps_per_sec else rate
            self._drawn = render_bar(progress, self._steps_per_sec, shutil.get_terminal_size((100, 24)).columns - 1)
            self.stream.write(CLEAR_LINE + self._drawn)
        else:  # a message goes above the bar, which stays at the bottom
            self.stream.write(CLEAR_LINE + msg + "\n" + self._drawn)
        self.stream.flush()

    def close(self) -> None:
        """Leave the last bar on screen and end its line, so what follows starts on a fresh one."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = ""


def render_bar(p: Progress, steps_per_sec: float, width: int) -> str:
    eta = format_duration((p.total_steps - p.step) / steps_per_sec) if steps_per_sec > 0 else "?"
    head = f"epoch {p.epoch}/{p.epochs} "
    tail = (f" {100 * p.step / p.total_steps:3.0f}% step {p.step}/{p.total_steps} | {p.samples_per_sec:,.0f} samples/s"
            f" | loss {p.loss:.4f} | ETA {eta}")
    cells = max(10, min(25, width - len(head) - len(tail) - 2))
    done = round(cells * p.step / p.total_steps)
    return (head + "[" + "#" * done + "-" * (cells - done) + "]" + tail)[:max(width, 20)]


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
