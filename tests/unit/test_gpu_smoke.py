"""scripts/gpu_smoke.py (`make test-gpu`), the parts a CPU can show in this process: each strategy's row of precisions,
the mesh cells' runs passing the driver. A cell past its time: tests/runs/test_gpu_smoke.py."""
import os

import pytest

from support.driver import driver_says
from support.fake_cuda import cuda_reported
from support.processes import gpu_smoke_script


def test_every_strategy_row_names_the_precisions_it_trains_in():
    smoke = gpu_smoke_script()
    for gpus in (1, 2, 8):
        rows = smoke.strategies(gpus)
        assert rows["fsdp"][1] == ("fp32", "bf16") and rows["fsdp cpu_offload"][1] == ("bf16",)
        # DeepSpeed's ZeRO 1-3 optimizer steps fp16 wrong (refused in the driver): fp16 runs at ZeRO 0 only
        assert rows["deepspeed z2"][1] == rows["deepspeed z3"][1] == ("fp32", "bf16")
        assert rows["deepspeed z0"] == (["strategy=deepspeed", "strategy.zero_stage=0"], ("fp16",))
        assert "strategy.cpu_offload=true" in rows["fsdp cpu_offload"][0]
        assert ("strategy.nproc_per_node=1" in rows["fsdp"][0]) == (gpus == 1)


def test_the_mesh_cells_need_two_gpus_and_their_runs_pass_the_driver(tmp_path):
    """tp and pp cells: skipped below 2 GPUs (nccl takes one rank per GPU); their runs, on the text the script
    writes itself (no dataset from the network), pass every check of the driver (here with CPU workers, where the
    accelerator is the only difference)."""
    smoke = gpu_smoke_script()
    assert all(args is None for args, _ in smoke.mesh_strategies(1).values())
    rows = smoke.mesh_strategies(4)
    text = smoke.write_text(tmp_path / "text.txt")
    common = [a for a in smoke.MESH_COMMON if a != "trainer.accelerator=gpu"]
    for name, (args, precisions) in rows.items():
        assert "fp16" not in precisions
        for precision in precisions:
            line = driver_says([*args, *common, f"dataset.path={text}", f"trainer.precision={precision}",
                                "trainer.accelerator=cpu"], tmp_path / name)
            assert line == "", (name, precision, line)


def test_the_cells_kill_their_first_run_with_the_tests_own_fault_injection():
    """Every cell's first run loads the tests' fault injection from PYTHONPATH: the folder moved with the suite's
    tiers (tests/support/faults), and a stale path failed every cell on every GPU machine (the callback could not be
    imported, so no first run was killed)."""
    smoke = gpu_smoke_script()
    assert (smoke.FAULTS / "fault_injection.py").is_file()
    assert smoke.KILL[0] == "+callbacks.faults._target_=fault_injection.FaultInjection"


def test_the_mesh_has_cells_for_compile_and_recompute_and_a_zero_bubble_schedule():
    rows = gpu_smoke_script().mesh_strategies(2)
    assert {"trainer.compile=true", "trainer.activation_checkpointing=true"} <= set(
        rows["tp (tp=2) compile + recompute"][0])
    assert "strategy.schedule=ZBVZeroBubble" in rows["pp (pp=2, ZBVZeroBubble)"][0]
    assert rows["tp x dp_shard (2 x 2)"][0] is None, "4 GPUs"


def test_the_compression_cells_pass_the_driver(tmp_path):
    """ddp's fp16, bf16 and PowerSGD hooks, fsdp's bf16 reduce and Horovod's fp16 on the GPUs: each run passes every
    check of the driver (here with CPU workers, where the accelerator is the only difference)."""
    smoke = gpu_smoke_script()
    common = [a for a in smoke.COMMON if a != "trainer.accelerator=gpu"]
    for name, (args, precisions) in smoke.compression_cells(["strategy=ddp"], ["strategy=fsdp"]).items():
        for precision in precisions:
            line = driver_says([*args, *common, f"trainer.precision={precision}", "trainer.accelerator=cpu"],
                               tmp_path / name.replace(" ", "_"))
            assert line == "", (name, precision, line)


# (GPUs, whether they have bf16): one, two and eight GPUs, of a generation with bf16 (A100, H100) and without (V100, T4)
MACHINES = {"1_gpu_no_bf16": (1, False), "2_gpus_bf16": (2, True), "8_gpus_no_bf16": (8, False)}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("machine", list(MACHINES))
def test_every_cell_the_matrix_runs_passes_the_driver_on_gpus(tmp_path, monkeypatch, machine, precision):
    """Each cell's whole command line, as make test-gpu would start it, through the driver with CUDA reported: the
    fp32 cell of `fsdp compression=bf16` was refused on every GPU without bf16 (only ddp's bf16 row was dropped), and
    a check with CPU workers never reached that refusal."""
    gpus, bf16 = MACHINES[machine]
    cuda_reported(monkeypatch, gpus, bf16)
    smoke = gpu_smoke_script()
    precisions, skips, cells = smoke.plan(gpus, bf16, smoke.write_text(tmp_path / "text.txt"))
    assert ("bf16" in precisions) == bf16
    if not bf16:
        assert skips["fsdp compression=bf16"].startswith("skipped: bf16 compression needs GPUs with bf16")
        assert cells["fsdp compression=bf16", "fp32"] == "skipped"
    checked = 0
    for (name, cell_precision), args in cells.items():
        if cell_precision != precision or isinstance(args, str):
            continue
        assert "trainer.accelerator=gpu" in args and f"trainer.precision={precision}" in args
        line = driver_says(args, tmp_path / f"{name}-{precision}".replace(" ", "_").replace("(", "").replace(")", ""))
        assert line == "", (name, precision, line)
        checked += 1
    assert checked or (precision == "bf16" and not bf16)


def test_make_test_gpu_fails_where_the_machine_has_gpus_torch_cannot_use(tmp_path, monkeypatch, capsys):
    """A torch built for a newer CUDA than the driver runs sees no GPU: the matrix said 'no CUDA GPU is visible ...
    (exit 0)' and make test-gpu passed. nvidia-smi (a stand-in on PATH, as a T4 with an older driver answers) shows
    the GPUs; NVML is kept out, so that nvidia-smi is what is asked."""
    import sys

    import torch

    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    stub = tmp_path / "bin" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\ncase \"$1\" in\n  --query-gpu=*) echo '0, Tesla T4, 15360, GPU-1234, 470.82.01';;\n"
                    "  -q) echo 'Driver Version                            : 470.82.01'\n"
                    "      echo 'CUDA Version                              : 11.4';;\nesac\n")
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub.parent}{os.pathsep}{os.environ['PATH']}")
    assert gpu_smoke_script().main() == 1
    line = capsys.readouterr().out.strip()
    assert line == (f"make test-gpu: FAILED: this machine has 1 NVIDIA GPU(s) and torch {torch.__version__} (built for "
                    "CUDA 13.0) cannot use them: the driver 470.82.01 runs CUDA up to 11.4; install a torch built for "
                    "that CUDA or older, or a newer driver"), line
    # where nvidia-smi finds no driver, the machine has no GPU: nothing to run, exit 0
    stub.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver'\n"
                    "exit 9\n")
    assert gpu_smoke_script().main() == 0
    assert "no CUDA GPU is visible on this machine" in capsys.readouterr().out
