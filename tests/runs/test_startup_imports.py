"""What the driver has imported when the workers' template (multiprocessing's forkserver, framework/launch/
template.py) starts, and when it types the config. A direct run of a mesh preset starts the template right after
Hydra composed, before the driver imports torch (framework/cli.py: train_app), so the template's ~4 s of imports run
beside the driver's torch and checks, and a refusal stops it again. Other runs start it after the typing (framework/
run.py: plan_run): trainer.compile_backend's check listed torch's compile backends for the default `inductor`, which
imports torch._dynamo (about 2 s on 2 cores) ahead of the template; the driver's dry run still imports it when it
builds the optimizer (torch.optim's add_param_group), after the template started.

A process of its own: the subject is what a fresh interpreter has imported, and which processes it leaves, which
this test process (with every other test's imports) cannot show."""
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


ORDER_PROBE = """
import json, os, sys
import framework.launch.template as template
from framework import cli

started = template.start_worker_template
torch_loaded_at_start = []

def noted(*modules):
    torch_loaded_at_start.append("torch" in sys.modules)
    return started(*modules)

template.start_worker_template = noted
sys.argv = ["train.py", *sys.argv[1:]]
try:
    cli._main()
except SystemExit as ended:
    code = ended.code
children = set()
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1]) == os.getpid():
            children.add(pid)
    except OSError:
        pass
commands = [open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace") for pid in children
            if os.path.exists(f"/proc/{pid}/cmdline")]
print(json.dumps({"code": code, "torch_loaded_at_start": torch_loaded_at_start,
                  "templates_left": [c for c in commands if "forkserver" in c]}))
"""


def test_a_ddp_runs_template_starts_before_the_driver_imports_torch_and_a_refusal_stops_it(tmp_path):
    """trainer.max_steps=0 is refused by the driver's typing, which comes after the template started."""
    out = subprocess.run([sys.executable, "-c", ORDER_PROBE, "strategy=ddp", "strategy.nproc_per_node=2",
                          "trainer.accelerator=cpu", "trainer.max_steps=0"], cwd=tmp_path, capture_output=True,
                         text=True, env=python_path(REPO, REPO / "tests"), timeout=300)
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["code"] == 2, out.stderr[-3000:]
    assert "trainer.max_steps=0 is not allowed" in out.stderr
    assert said["torch_loaded_at_start"][:1] == [False], said
    assert said["templates_left"] == [], said


DDP_PARTS_PROBE = """
import json, os, sys
import torch
import torch.distributed as dist
import framework.worker
from support.driver import strategy_for
from framework.session.environment import TORCH, Ranks

SHARDED_SIDE = ("torch.distributed.tensor", "torch.distributed.checkpoint", "torch.distributed.fsdp",
                "torch.distributed.pipelining", "framework.strategies.mesh.sharded")
strategy = strategy_for("strategy=ddp", "trainer.accelerator=cpu", ranks=Ranks(TORCH, 0, 0, 1, 1))
strategy.validate()
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
group = strategy.join()
joined = [m for m in SHARDED_SIDE if m in sys.modules]
wrapped = strategy.parallelize(torch.nn.Linear(4, 2), lambda params, **_: torch.optim.SGD(params, lr=0.1), group)
wrapped.model(torch.randn(3, 4)).sum().backward()
dist.destroy_process_group()
not_dynamos = [m for m in SHARDED_SIDE if m not in ("torch.distributed.tensor", "torch.distributed.fsdp")]
print(json.dumps({"joined": joined, "model": type(wrapped.model).__name__,
                  "wrapped": [m for m in not_dynamos if m in sys.modules]}), flush=True)
os._exit(0)  # as a finished worker ends (framework/session/exit.py): torch's teardown aborts now and then (SIGABRT)
"""


def test_a_ddp_worker_imports_no_sharded_engine_and_no_dcp(tmp_path):
    """A ddp worker's imports, its engine built, validated and joined: none of DTensor, FSDP2, DCP, the pipeline or
    the mesh's sharded side (framework/strategies/mesh/engine.py: data_parallel_for). Its first optimizer then
    imports torch._dynamo (the workers' template preloads it), which imports DTensor and FSDP2 itself; DCP (about
    0.7 s) and the sharded side still stay out: a ddp run writes one-file checkpoints."""
    out = subprocess.run([sys.executable, "-c", DDP_PARTS_PROBE, str(tmp_path / "store")], cwd=tmp_path,
                         capture_output=True, text=True, env=python_path(REPO, REPO / "tests"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "joined": [], "model": "DistributedDataParallel", "wrapped": []}


def test_the_driver_and_eval_py_leave_tensorboard_to_the_run_that_logs_or_profiles(tmp_path):
    """torch.utils.tensorboard (about 0.1 s) is imported where a writer is made: the TensorBoard logger's callback
    and the profiler's report (framework/callbacks/profiler.py), not by the driver's or eval.py's modules."""
    probe = "import sys, framework.run, framework.evaluate; print('torch.utils.tensorboard' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True,
                         env=python_path(REPO, REPO / "tests"), timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_template_a_starter_started_at_warm_up_is_stopped_with_the_run(tmp_path):
    """Not a mesh preset's _target_ (an earlier version's ddp class, as deepspeed's or a user's engine): the template
    starts after the typing (Starter.warm_up); the checks after it refuse the missing checkpoint, and the template is
    stopped with the run (it outlived the driver by 1.5 s, a process of the run left behind: checked)."""
    out = subprocess.run([sys.executable, "-c", ORDER_PROBE, "strategy=ddp", "strategy.nproc_per_node=2",
                          "strategy._target_=framework.strategies.ddp.DDPStrategy", "trainer.accelerator=cpu",
                          "trainer.resume=/no/such/run"], cwd=tmp_path, capture_output=True, text=True,
                         env=python_path(REPO, REPO / "tests"), timeout=300)
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["code"] == 2 and "trainer.resume=/no/such/run is not allowed" in out.stderr, out.stderr[-3000:]
    assert said["torch_loaded_at_start"] == [True], said  # started at warm_up, after the typing
    assert said["templates_left"] == [], said
