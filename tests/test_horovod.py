"""strategy=horovod: workers started by Horovod's own runner (gloo), real processes, TensorBoard read back.

The module is skipped only when horovod is not importable; scripts/setup.sh builds it (setup.d/10-horovod.sh)."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import (TINY, TRAIN, assert_curves_match, check_ok, driver_says, faults_env, held_at, losses_by_step,
                      needs_gpu, pin_accelerator, read_scalars, run_dirs, run_train, start_train, train_loss_curve,
                      wait_until_held)

try:
    import horovod.torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"horovod is not importable ({exc}); build it with: bash scripts/setup.d/10-horovod.sh .venv",
                allow_module_level=True)

EQUIVALENCE = ["trainer.max_steps=10", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
               "dataset.max_train_samples=1024", "dataset.max_test_samples=256"]


def _decreasing(series):
    return series[-1][1] < series[0][1]


def test_two_horovod_workers_train_and_log_per_rank_throughput(tmp_path):
    out = check_ok(run_train(["strategy=horovod", *TINY], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    assert run_dir.name.endswith("_horovod_lenet")
    assert "strategy=horovod: no GPU in use, so 2 CPU workers on gloo" in out
    scalars = read_scalars(run_dir)
    for r in (0, 1):
        assert all(v > 0 for _, v in scalars[f"throughput/samples_per_sec/rank{r}"])
        assert _decreasing(scalars[f"loss/train/rank{r}"])
    assert "throughput/samples_per_sec/rank2" not in scalars
    assert _decreasing(scalars["loss/train"])
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "horovod" and result["processes"] == 2
    assert len(result["per_rank_samples_per_sec"]) == 2 and result["test_acc"] > 0.5
    assert out.count("training LeNet") == 1, "progress lines come from rank 0 only"


@pytest.mark.parametrize("extra", [["optimizer=adam"], ["optimizer=sgd", "trainer.grad_clip=0.5"]],
                         ids=["adam", "sgd-clipped"])
def test_horovod_two_workers_match_one_process_for_ten_steps(tmp_path, extra):
    """Clipping takes HorovodPrecision's path: synchronize, clip the averaged gradients, step without re-syncing."""
    losses = {}
    for strategy in ("single", "horovod"):
        losses[strategy] = train_loss_curve([f"strategy={strategy}", *extra, *EQUIVALENCE], tmp_path / strategy)
    assert [s for s, _ in losses["horovod"]] == list(range(1, 11))
    assert_curves_match(losses["single"], losses["horovod"], 1e-5, ("single", "horovod"))
    assert losses["horovod"][-1][1] < losses["horovod"][0][1]


def test_gradient_accumulation_matches_one_process(tmp_path):
    """backward_passes_per_step follows trainer.grad_accum: 2 workers x 2 micro-batches = one process's batch."""
    losses = {}
    for strategy, accum in (("single", 1), ("horovod", 2)):
        losses[strategy] = train_loss_curve([f"strategy={strategy}", f"trainer.grad_accum={accum}", "optimizer=sgd",
                                             *EQUIVALENCE, "trainer.max_steps=4"], tmp_path / strategy)
    assert_curves_match(losses["single"], losses["horovod"], 1e-5, ("single", "horovod with accumulation"))


def test_fp16_compression_and_sum_op_train(tmp_path):
    check_ok(run_train(["strategy=horovod", "strategy.compression=fp16", "strategy.op=sum", "optimizer=sgd",
                        *EQUIVALENCE, "trainer.max_steps=16"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    assert _decreasing(read_scalars(run_dir)["loss/train"])


def test_checkpoint_and_resume_give_the_same_losses(tmp_path):
    # The first part stops through trainer.max_steps=6, which would also shorten a warm-up/cosine schedule
    # (it spans the run's total steps): a constant lr keeps both parts on the full run's curve.
    args = ["strategy=horovod", *EQUIVALENCE, "trainer.checkpoint_every_n_steps=4", "lr_schedule=constant"]
    full, part = tmp_path / "full", tmp_path / "part"
    full.mkdir()
    part.mkdir()
    check_ok(run_train(args, full))
    check_ok(run_train([*args, "trainer.max_steps=6"], part))  # checkpoints at steps 4 and 6 (its end)
    [run_dir] = run_dirs(part)
    assert (run_dir / "checkpoints" / "step-00000006.pt").exists()
    out = check_ok(run_train([*args, f"hydra.run.dir={run_dir}"], part))
    assert "resumed from" in out and "(step 6, " in out
    result = json.loads((run_dir / "result.json").read_text())
    assert result["resumed_from_step"] == 6 and result["steps"] == 10
    [full_dir] = run_dirs(full)
    expected = losses_by_step(full_dir)
    resumed = losses_by_step(run_dir)
    for step in range(7, 11):
        assert abs(expected[step] - resumed[step]) <= 1e-5 * abs(expected[step]), f"step {step}"


def test_sweep_over_ddp_and_horovod_makes_one_folder_per_job(tmp_path):
    check_ok(run_train(["-m", "strategy=ddp,horovod", *TINY, "trainer.epochs=1"], tmp_path, timeout=400))
    jobs = run_dirs(tmp_path)
    assert sorted(j.name.split("_", 1)[1] for j in jobs) == ["strategy=ddp", "strategy=horovod"]  # what varies
    assert len({j.parent for j in jobs}) == 1
    for job in jobs:
        scalars = read_scalars(job)
        assert "throughput/samples_per_sec/rank1" in scalars and "throughput/samples_per_sec/rank2" not in scalars


@pytest.mark.parametrize("args,message", [
    (["strategy.np=0"], "strategy.np=0 is not allowed: expected an integer >= 1 or null"),
    (["trainer.channels_last=true"], "trainer.channels_last=true is not allowed with strategy=horovod"),
    (["strategy.compression=int8"], "strategy.compression='int8' is not allowed: expected one of none, fp16"),
    (["strategy.op=max"], "strategy.op='max' is not allowed: expected one of average, sum, adasum"),
    (["strategy.op=adasum"], "strategy.op=adasum is not allowed with this horovod build: Adasum needs horovod built with MPI"),
    (["strategy.backward_passes_per_step=4"],
     "strategy.backward_passes_per_step=4 is not allowed: it is trainer.grad_accum (1), the one setting"),
    (["strategy.hosts=node1"], "strategy.hosts='node1' is not allowed: expected HOST:SLOTS[,HOST:SLOTS...]"),
    (["strategy.hosts=localhost:1", "strategy.np=2"], "strategy.np=2 is not allowed with strategy.hosts='localhost:1'"),
    (["strategy.np=3", "trainer.batch_size=64"], "trainer.batch_size=64 is not allowed with 3 process(es)"),
], ids=["np", "channels_last", "compression", "op", "adasum", "backward_passes", "hosts_form", "hosts_slots",
        "batch_split"])
def test_bad_horovod_values_fail_before_any_worker_starts(tmp_path, args, message):
    line = driver_says(["strategy=horovod", *args, *TINY], tmp_path)  # in this process: test_bad_inputs.py says why
    assert message in line, line


def test_a_worker_exception_becomes_one_clear_error(tmp_path):
    proc = run_train(["strategy=horovod", *TINY, "trainer.max_steps=3"], tmp_path,
                     faults="raise_after_step:2:1")
    assert proc.returncode != 0
    assert "error: worker rank 1 failed: RuntimeError: fault injection: an error after step 2" in proc.stderr, proc.stderr


def test_a_killed_worker_stops_the_job_with_a_clear_error(tmp_path):
    proc = run_train(["strategy=horovod", *TINY, "trainer.max_steps=20"], tmp_path,
                     faults="kill_after_step:2:1")
    assert proc.returncode != 0
    assert "error: worker rank 1 was killed by SIGKILL (exit code 137)" in proc.stderr, proc.stderr
    assert "done: test accuracy" not in proc.stdout


def _processes_tagged(tag: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    if tag.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_every_worker_and_says_how_to_resume(tmp_path, sig):
    tag = uuid.uuid4().hex
    args = held_at(["strategy=horovod", "trainer.max_steps=400", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
                    "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=512",
                    "dataset.max_test_samples=128"], step=6)  # rank 0 waits at the end of step 6 for the signal
    proc = start_train(args, tmp_path, {**faults_env(), "HYDRA_DIST_TEST_TAG": tag})
    wait_until_held(proc, tmp_path)
    proc.send_signal(sig)
    proc.wait(timeout=60)
    err = (tmp_path / "train.err").read_text()
    deadline = time.monotonic() + 15
    while _processes_tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.returncode == 128 + sig, err
    assert f"stopped by {signal.Signals(sig).name}; all workers are stopped" in err
    assert "To resume: python train.py" in err
    assert _processes_tagged(tag) == [], "no worker process is left behind"


@needs_gpu
def test_horovod_on_gpus_uses_nccl_and_trains(tmp_path):
    import torch

    if not horovod.torch.nccl_built():  # built on a machine without a GPU (scripts/setup.d/10-horovod.sh)
        pytest.skip("horovod was built without NCCL; rebuild it on this GPU machine: .venv/bin/python -m pip "
                    "uninstall -y horovod && bash scripts/setup.d/10-horovod.sh .venv")
    gpus = torch.cuda.device_count()
    out = check_ok(run_train(["strategy=horovod", *TINY, "trainer.epochs=1", "trainer.accelerator=gpu"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["device"] == "cuda" and result["processes"] == gpus
    assert "memory/max_allocated_gib/rank0" in read_scalars(run_dir)
    assert "done: test accuracy" in out


def _train_without_horovod(args, cwd):
    """train.py in a process where `import horovod` fails, as on a machine without it (None in sys.modules
    is Python's own way to make an import fail)."""
    code = ("import runpy, sys; sys.modules['horovod'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, str(TRAIN), *pin_accelerator(args)], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_without_horovod_one_clear_error_names_the_install_command(tmp_path):
    proc = _train_without_horovod(["strategy=horovod", *TINY], tmp_path)
    assert proc.returncode != 0
    assert "error: strategy=horovod is not allowed: horovod is not usable here" in proc.stderr
    assert "install it with: bash scripts/setup.d/10-horovod.sh .venv" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_other_strategies_never_import_horovod(tmp_path):
    check_ok(_train_without_horovod(["strategy=single", *TINY, "trainer.max_steps=2"], tmp_path))
