"""The driver types a run's config without importing torch._dynamo: the workers' template (multiprocessing's
forkserver, framework/launch/elastic.py) starts right after the typing (framework/run.py: plan_run), so every second
spent there is a second before any worker exists. trainer.compile_backend's check listed torch's compile backends for
the default `inductor`, which imports torch._dynamo (about 2 s on 2 cores) ahead of the template; the driver's
dry run still imports it when it builds the optimizer (torch.optim's add_param_group), after the template started.

A process of its own: the subject is what a fresh interpreter has imported, which this test process (with every
other test's imports) cannot show."""
from __future__ import annotations

import json
import subprocess
import sys

from support.processes import REPO, python_path

PROBE = """
import json, sys
from support.driver import composed
from framework.config.settings import settings_of
from framework.strategies import choose_strategy
cfg = composed("strategy=ddp", "strategy.nproc_per_node=2", "trainer.accelerator=cpu")
strategy_class, _ = choose_strategy(cfg, None)
settings = settings_of(cfg, strategy_class.Options)
print(json.dumps({"backend": settings.trainer.compile_backend, "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_typing_a_ddp_runs_config_leaves_torch_dynamo_for_later(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True,
                         env=python_path(REPO, REPO / "tests"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"backend": "inductor", "dynamo": False}
