"""The console: rank 0 draws a progress bar (steps, samples/s, loss, ETA) on a real terminal (a pseudo-terminal
here), the plain lines stay exactly as before without one, train.log always has the plain lines, and other
ranks are quiet unless trainer.log_all_ranks=true, which prefixes their lines with the rank."""
import os
import pty
import re
import select
import subprocess
import sys
import time

from support.processes import TINY, TRAIN, check_ok, pin_accelerator, run_train
from support.run_files import read_scalars, run_dirs, walk

PLAIN_INTERVAL = re.compile(r"^epoch 1/\d step 4/\d+ \| loss \d+\.\d{4} \| [\d,]+ samples/s \(per rank: ", re.M)
BAR = re.compile(r"\r\x1b\[Kepoch \d/\d \[[#-]+\] +\d+% step \d+/\d+ \| [\d,]+ samples/s \| loss \d+\.\d{4} \| ETA \d:\d\d:\d\d")


def _run_on_a_terminal(args: list[str], cwd, timeout: float = 240) -> tuple[int, str]:
    """train.py with stdout and stderr on a pseudo-terminal, as in an interactive shell."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "150"}
    proc = subprocess.Popen([sys.executable, str(TRAIN), *pin_accelerator(args)], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every process holding the terminal has exited
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


def test_single_on_a_terminal_shows_a_progress_bar_and_train_log_keeps_plain_lines(tmp_path):
    code, screen = _run_on_a_terminal(["strategy=single", *TINY], tmp_path)
    assert code == 0, screen
    bars = BAR.findall(screen)
    assert len(bars) >= 8, screen  # redrawn at every log interval (64 steps / 4)
    assert "step 64/64" in bars[-1] and "100%" in bars[-1] and "ETA 0:00:00" in bars[-1]
    assert not PLAIN_INTERVAL.search(screen), "on a terminal the interval lines become the bar"
    assert "epoch 2/2 test loss" in screen and "done: test accuracy" in screen
    # the bar's line is ended before the driver's last line, so it starts on a fresh line
    assert re.search(r"ETA 0:00:00\r?\n(\r?\n)*done: test accuracy", screen), screen[-600:]
    [run_dir] = run_dirs(tmp_path)
    log = (run_dir / "train.log").read_text()
    assert PLAIN_INTERVAL.search(log) and "\x1b" not in log and "\r" not in log
    assert not [tag for tag in read_scalars(run_dir) if tag.startswith("gpu/")], "no NVML readings on the CPU"


def test_ddp_rank0_keeps_the_terminal_and_other_ranks_are_quiet_by_default(tmp_path):
    code, screen = _run_on_a_terminal(["strategy=ddp", "strategy.nproc_per_node=2", *TINY, "trainer.epochs=1"], tmp_path)
    assert code == 0, screen
    assert len(BAR.findall(screen)) >= 4, screen  # rank 0 runs in a spawned worker and still has the terminal
    assert screen.count("training LeNet") == 1 and "[rank1]" not in screen
    [run_dir] = run_dirs(tmp_path)
    rank1_logs = walk(run_dir / "worker_logs", "1/stdout.log")
    assert len(rank1_logs) == 1, "rank 1's output is kept in the run folder"


def test_without_a_terminal_lines_are_plain_and_log_all_ranks_prefixes_other_ranks(tmp_path):
    out = check_ok(run_train(["strategy=ddp", "strategy.nproc_per_node=2", "trainer.log_all_ranks=true", *TINY,
                              "trainer.epochs=1"],
                             tmp_path))
    assert PLAIN_INTERVAL.search(out) and "\x1b" not in out and "\r" not in out
    assert re.search(r"^training LeNet on fashion_mnist with strategy=ddp", out, re.M), "rank 0 is not prefixed"
    assert re.search(r"^\[rank1\]: training LeNet on fashion_mnist with strategy=ddp", out, re.M), out
    assert out.count("done: test accuracy") == 1
