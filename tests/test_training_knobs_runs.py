"""Training knobs in real runs (2 CPU workers where the engine has several): two parameter groups (classifier frozen
by lr_scale 0, no weight decay on the other biases) under single, ddp, fsdp and deepspeed, each with one of torch's
lr schedulers (StepLR, OneCycleLR, ReduceLROnPlateau) by _target_. Each run's checkpoints hold the groups with their
settings, the frozen parameters end where they started, TensorBoard's lr of every group is torch's own scheduler
stepped by hand, weights/*.safetensors hold the same tensors as weights/*.pt, and a killed run resumed (or a run
resumed from another's checkpoint) gives the same lrs and losses. tests/test_training_knobs.py checks the parts in
process; here, the strategies' real paths. eval.py refusing a run folder's package: the last test."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, assert_killed_run_resumes, check_ok, composed, losses_by_step, read_scalars, run_dirs, \
    run_train
from framework.assemble import build_task
from framework.config.settings import settings_of
from framework.strategies import strategy_class
from framework.worker import seed_everything

pytestmark = pytest.mark.slow

STEPS = 6  # checkpoints at 2, 4, 6; the killed runs die after step 5 and resume from step 4
LR = 0.05  # optimizer=sgd
GROUPS = ("optimizer.param_groups=[{name:frozen,params:[classifier.*],lr_scale:0},"
          "{name:no_decay,params:[*.bias],weight_decay:0.0}]")
COMMON = ["dataset=synthetic", "dataset.train_size=512", "dataset.test_size=64", "optimizer=sgd",
          "optimizer.weight_decay=0.01", GROUPS, "lr_schedule=torch", f"trainer.max_steps={STEPS}",
          "trainer.batch_size=32", "trainer.log_every_n_steps=1", "trainer.checkpoint_every_n_steps=2",
          "trainer.eval_every_n_steps=2"]
SCALES = {"default": 1.0, "frozen": 0.0, "no_decay": 1.0}  # the optimizer's groups, in order
SCHEDULERS = {
    "step": ("{_target_:torch.optim.lr_scheduler.StepLR,step_size:2,gamma:0.5}",
             lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)),
    "one_cycle": ("{_target_:torch.optim.lr_scheduler.OneCycleLR,max_lr:0.1}",  # per group: x lr_scale
                  lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[0.1 * s for s in SCALES.values()],
                                                                  total_steps=STEPS)),
    # threshold 0.9: only a 90% better accuracy counts, so the lr halves after every evaluation but the first
    "plateau": ("{_target_:torch.optim.lr_scheduler.ReduceLROnPlateau,factor:0.5,patience:0,threshold:0.9}",
                lambda opt: torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0,
                                                                       threshold=0.9)),
}
ENGINES = {  # engine: (its options, the scheduler it runs with, the rank the killed run loses)
    "single": (["strategy=single"], "step", 0),
    "ddp": (["strategy=ddp", "strategy.nproc_per_node=2"], "one_cycle", 1),
    "fsdp": (["strategy=fsdp", "strategy.nproc_per_node=2"], "plateau", 0),
    "deepspeed": (["strategy=deepspeed", "strategy.nproc_per_node=2", "strategy.zero_stage=2"], "step", None),
}


def args_of(engine: str) -> list[str]:
    options, scheduler, _ = ENGINES[engine]
    return [*options, *COMMON, f"lr_schedule.scheduler={SCHEDULERS[scheduler][0]}"]


class References(dict):
    """One uninterrupted run per engine, made when a test first asks for it: its run folder by engine."""

    def __init__(self, tmp_path_factory):
        super().__init__()
        self.tmp_path_factory = tmp_path_factory

    def __missing__(self, engine: str):
        if engine == "deepspeed":
            pytest.importorskip("deepspeed")
        cwd = self.tmp_path_factory.mktemp(engine)
        check_ok(run_train(args_of(engine), cwd, timeout=600))
        [self[engine]] = run_dirs(cwd)
        return self[engine]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    return References(tmp_path_factory)


def group_lrs_logged(run_dir) -> dict[int, list[float]]:
    scalars = read_scalars(run_dir)
    by_group = [dict(scalars[f"lr/{name}"]) for name in SCALES]
    return {step: [lrs[step] for lrs in by_group] for step in sorted(by_group[0])}


def lrs_by_hand(scheduler: str, accuracy: dict[int, float]) -> dict[int, list[float]]:
    """torch's own loop over three groups of the run's lrs: the lr of each at steps 1..STEPS (ReduceLROnPlateau
    stepped on the accuracy each evaluation gave, every 2 steps)."""
    optimizer = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": LR * s}
                                 for s in SCALES.values()], lr=LR)
    torch_scheduler = SCHEDULERS[scheduler][1](optimizer)
    seen = {}
    for step in range(1, STEPS + 1):
        seen[step] = [g["lr"] for g in optimizer.param_groups]
        optimizer.step()
        if scheduler != "plateau":
            torch_scheduler.step()
        elif step in accuracy:
            torch_scheduler.step(accuracy[step])
    return seen


def initial_model_state(engine: str) -> dict:
    """The model every worker starts from: seeded, built as the worker builds it (before any engine wraps it)."""
    cfg = composed(*args_of(engine), "trainer.accelerator=cpu")
    settings = settings_of(cfg, strategy_class(cfg.strategy).Options)
    seed_everything(settings.trainer.seed)
    return build_task(settings, torch.device("cpu"), None).model.state_dict()


@pytest.mark.parametrize("engine", list(ENGINES))
def test_two_groups_and_a_torch_scheduler_under_every_engine(references, engine):
    run_dir = references[engine]
    scheduler = ENGINES[engine][1]
    manifest = json.loads(sorted((run_dir / "checkpoints").glob("step-*.json"))[-1].read_text())
    groups = {g["name"]: g for g in manifest["param_groups"]}
    assert list(groups) == list(SCALES)
    assert groups["frozen"]["lr_scale"] == 0.0 and groups["frozen"]["lr"] == 0.0
    assert groups["no_decay"]["weight_decay"] == 0.0 and groups["default"]["weight_decay"] == 0.01
    assert manifest["signature"]["param_groups"][0]["name"] == "frozen"

    start, last = initial_model_state(engine), load_file(run_dir / "weights" / "last.safetensors")
    assert set(last) == set(start)
    for name, tensor in start.items():
        unchanged = torch.equal(last[name], tensor)
        assert unchanged == name.startswith("classifier."), f"{name}: {'unchanged' if unchanged else 'trained'}"

    for which in ("best", "last"):  # weights/*.safetensors beside every weights/*.pt, the same tensors
        pt = torch.load(run_dir / "weights" / f"{which}.pt", weights_only=True)["model"]
        st = load_file(run_dir / "weights" / f"{which}.safetensors")
        assert set(pt) == set(st) and all(torch.equal(pt[k], st[k]) for k in pt)

    accuracy = dict(read_scalars(run_dir)["acc/val"])
    logged, expected = group_lrs_logged(run_dir), lrs_by_hand(scheduler, accuracy)
    assert sorted(logged) == list(range(1, STEPS + 1))
    for step in logged:
        assert logged[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    assert len(set(map(tuple, logged.values()))) > 1, "the scheduler moved the lr"


@pytest.mark.parametrize("engine", [e for e, (_, _, rank) in ENGINES.items() if rank is not None])
def test_a_killed_run_resumes_with_the_same_lrs_and_losses(references, tmp_path, engine):
    run_dir = assert_killed_run_resumes(tmp_path, args_of(engine), f"kill_after_step:5:{ENGINES[engine][2]}",
                                        references[engine], STEPS, resumed_from=4)
    assert group_lrs_logged(run_dir) == group_lrs_logged(references[engine])  # the same numbers, to the bit


def test_a_deepspeed_run_resumes_another_runs_checkpoint_with_its_groups_and_schedule(references, tmp_path):
    """DeepSpeed keeps the optimizer (and its groups) in its own checkpoint; the scheduler's state is ours."""
    reference = references["deepspeed"]
    checkpoint = reference / "checkpoints" / "step-00000004"
    out = check_ok(run_train([*args_of("deepspeed"), f"trainer.resume={checkpoint}"], tmp_path, timeout=300))
    assert "resumed from" in out
    [run_dir] = run_dirs(tmp_path)
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == [5, 6]
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    logged, whole = group_lrs_logged(run_dir), group_lrs_logged(reference)
    assert {s: logged[s] for s in (5, 6)} == {s: whole[s] for s in (5, 6)}


def test_eval_py_refuses_a_run_folders_package_until_allowed_targets_names_it(references, tmp_path):
    """A run folder whose model names a package this command does not allow: eval.py exits 2 with one line naming
    the target and allowed_targets, before the package is imported (its import would write a marker); naming the
    package in allowed_targets evaluates it."""
    run = tmp_path / "shared"
    subprocess.run(["cp", "-r", str(references["single"]), str(run)], check=True)
    resolved = run / "resolved_config.yaml"
    resolved.write_text(resolved.read_text().replace("_target_: framework.models.lenet.LeNet",
                                                     "_target_: strangers.Net"))
    marker, package = tmp_path / "imported", tmp_path / "pkgs" / "strangers"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        Path({str(marker)!r}).write_text("its code ran")
        from framework.models.lenet import LeNet as Net
        """))
    env = {"PYTHONPATH": str(tmp_path / "pkgs")}

    def eval_py(*args):
        return subprocess.run([sys.executable, str(REPO / "eval.py"), f"ckpt_path={run}", "strategy=single",
                               "trainer.accelerator=cpu", *args], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env={**os.environ, **env})

    refused = eval_py()
    assert refused.returncode != 0, refused.stderr
    [line] = [text for text in refused.stderr.splitlines() if text.startswith("error:")]
    assert line.startswith("error: model._target_=strangers.Net is not allowed: outside allowed_targets")
    assert line.endswith("allowed_targets=[strangers.*]") and "Traceback" not in refused.stderr
    assert not marker.exists() and not list(tmp_path.rglob("eval.json"))
    check_ok(eval_py("allowed_targets=[strangers.*]"))
    assert marker.exists()
