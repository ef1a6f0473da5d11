"""scripts/gpu_first.py (scripts/gpu_first.sh's checks), the parts a CPU can show in this process: every run it
starts passes the driver on a GPU machine of one GPU (CUDA reported, the device count faked: the GPU-only refusals
are reached), and its checks come in the order of their risk. Its gpu_smoke cells: tests/unit/test_gpu_smoke.py."""
import importlib.util

import pytest

from support.driver import driver_says
from support.processes import REPO
from support.fake_cuda import cuda_reported


def _gpu_first():
    spec = importlib.util.spec_from_file_location("gpu_first", REPO / "scripts" / "gpu_first.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_checks_come_highest_risk_first_and_fit_the_eight_minutes():
    checks = _gpu_first().checks()
    assert [c.name for c in checks] == ["powersgd fp16 overflow", "resnet18 compression", "fsdp bf16 accumulation",
                                        "verify tf32", "deterministic twice", "invariant twice"]
    assert sum(c.seconds for c in checks) < 8 * 60 - 120, "setup and some gpu_smoke cells fit beside them"


@pytest.mark.parametrize("name", ["powersgd fp16 overflow", "resnet18 compression", "verify tf32",
                                  "deterministic twice"])
def test_every_run_of_a_check_passes_the_driver_on_one_gpu(tmp_path, monkeypatch, name):
    """train.py's runs as they are; verify.py's as the train.py runs it compares (its verify.* keys taken out)."""
    cuda_reported(monkeypatch, 1, True)
    gpu_first = _gpu_first()
    monkeypatch.syspath_prepend(str(gpu_first.PROBES))  # as the script's runs have it on PYTHONPATH
    check = next(c for c in gpu_first.checks() if c.name == name)
    assert check.commands
    for i, (tool, overrides) in enumerate(check.commands):
        assert tool in ("train.py", "verify.py") and "trainer.accelerator=gpu" in overrides
        args = [o for o in overrides if not o.startswith("verify.")]
        line = driver_says(args, tmp_path / f"run{i}")
        assert line == "", (name, line)


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_the_invariant_runs_pass_the_driver_on_the_gpus_the_machine_has(tmp_path, monkeypatch, gpus):
    """The same run twice on one GPU, and ddp on 2 where there are 2 or more, on the text the script writes: the
    GPU-only refusals reached (CUDA reported), trainer.deterministic=true among them."""
    cuda_reported(monkeypatch, gpus, True)
    gpu_first = _gpu_first()
    check = next(c for c in gpu_first.checks(gpus) if c.name == "invariant twice")
    strategies = [next(o for o in overrides if o.startswith("strategy=")) for _, overrides in check.commands]
    assert strategies == ["strategy=single"] * 2 + (["strategy=ddp"] if gpus >= 2 else [])
    text = gpu_first.gpu_smoke.write_text(tmp_path / "text.txt")
    for i, (tool, overrides) in enumerate(check.commands):
        assert tool == "train.py" and {"trainer.accelerator=gpu", "trainer.micro_shards=8"} <= set(overrides)
        assert driver_says([*overrides, f"dataset.path={text}"], tmp_path / f"run{i}") == ""


def test_the_invariant_verdict_wants_every_loss_and_the_last_checkpoint_bitwise_equal():
    verdict = _gpu_first().invariant_verdict
    curve = {1: 4.17, 2: 4.05, 3: 3.9}
    assert verdict({"run 1 (single)": (curve, "ab"), "run 2 (single)": (dict(curve), "ab"),
                    "run 3 (ddp x2)": (dict(curve), "ab")}).startswith("ok: run 1 (single), run 2 (single), run 3")
    drifted = {**curve, 3: 3.9000001}
    assert verdict({"run 1 (single)": (curve, "ab"), "run 2 (single)": (drifted, "ab")}) == (
        "failed: run 2 (single)'s loss differs from run 1 (single)'s from step 3")
    assert verdict({"run 1 (single)": (curve, "ab"), "run 2 (ddp x2)": (curve, "cd")}) == (
        "failed: run 2 (ddp x2)'s last checkpoint's tensors differ from run 1 (single)'s")
    assert verdict({"run 1 (single)": (curve, "ab"), "run 2 (single)": ({1: 4.17, 2: 4.05}, "ab")}).startswith(
        "failed: run 2 (single)'s loss differs from run 1 (single)'s from step 3")
    assert verdict({"run 1 (single)": ({}, "ab"), "run 2 (single)": ({}, "ab")}) == "failed: run 1 (single) logged no loss"


def test_the_fsdp_accumulation_check_builds_the_engine_of_today(monkeypatch):
    """Its one-rank group is the mesh's (fsdp is a preset of the mesh engine): the check ran on an H200 with the
    group of the fsdp engine that was, and failed before it trained (AttributeError: no coords). On one rank the preset
    shards nothing, which the check now says instead of failing on a plain gradient."""
    gpu_first = _gpu_first()
    monkeypatch.syspath_prepend(str(REPO / "tests"))
    line = gpu_first.accumulated_in_one_rank("cpu")
    assert line.startswith("not run: the fsdp preset on one rank shards nothing"), line
