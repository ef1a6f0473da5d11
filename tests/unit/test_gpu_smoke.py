"""scripts/gpu_smoke.py (`make test-gpu`), the parts a CPU can show in this process: each strategy's row of precisions,
the mesh cells' runs passing the driver. A cell past its time: tests/runs/test_gpu_smoke.py."""
from support.driver import driver_says
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
