"""A real `tensorboard --logdir` server over a finished ddp run: the scalars it serves over HTTP are the
ones the run wrote, per rank."""
import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from support.processes import TINY
from support.run_files import read_scalars


@pytest.fixture
def tensorboard():
    servers = []

    def start(logdir) -> str:
        # --port 0: the server takes a free loopback port and prints it.
        proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
                                 "--host", "127.0.0.1", "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        servers.append(proc)
        deadline, seen = time.monotonic() + 90, ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            seen += line
            if match := re.search(r"(http://127\.0\.0\.1:\d+)/", line):
                return match.group(1)
            if not line and proc.poll() is not None:
                break
        raise AssertionError(f"tensorboard did not start:\n{seen}")

    yield start
    for proc in servers:
        proc.terminate()
        proc.wait(timeout=30)


def get_json(url: str, path: str, **query):
    full = f"{url}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(full, timeout=30) as response:
        return json.loads(response.read())


def test_tensorboard_serves_the_per_rank_throughput_of_a_ddp_run(runs, tensorboard):
    """The ddp run of tests/runs/test_end_to_end.py, served."""
    ddp = runs.train(["strategy=ddp", *TINY]).ok()
    run_dir = ddp.run_dir
    written = read_scalars(run_dir)

    url = tensorboard(ddp.cwd / "outputs")
    run = str(run_dir.relative_to(ddp.cwd / "outputs"))
    deadline = time.monotonic() + 60
    while run not in get_json(url, "/data/runs") and time.monotonic() < deadline:  # the first scan is lazy
        time.sleep(0.5)
    tags = get_json(url, "/data/plugin/scalars/tags")[run]
    for tag in ("throughput/samples_per_sec", "throughput/samples_per_sec/rank0",
                "throughput/samples_per_sec/rank1", "loss/train", "acc/val"):
        assert tag in tags

    for rank in (0, 1):
        tag = f"throughput/samples_per_sec/rank{rank}"
        served = get_json(url, "/data/plugin/scalars/scalars", run=run, tag=tag)  # [[wall_time, step, value], ...]
        assert [step for _, step, _ in served] == [step for step, _ in written[tag]]
        assert [value for _, _, value in served] == pytest.approx([value for _, value in written[tag]])
        assert all(value > 0 for _, _, value in served)
