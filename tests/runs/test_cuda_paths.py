"""The CUDA paths of real runs and plan.py's plan against what a GPU run allocates, marked gpu (they skip where the
machine has fewer GPUs than they need: `pytest -m gpu`, or `make test-gpu` for these plus the smoke matrix), and the
suite's own pinning of every run's accelerator, checked in a pytest of its own. In-process:
tests/unit/test_cuda_paths.py."""
import json
import os
import sys

import pytest
import torch

from framework.plan.device_constants import constants_of
from framework.plan.rows import plan_row
from support.driver import composed
from support.marks import needs_gpu, needs_gpus
from support.processes import (
    REPO,
    TINY,
    TRAIN,
    assert_killed_run_resumes,
    check_ok,
    faults_env,
    free_port,
    run_together,
    run_train,
    slurm_task,
)
from support.run_files import read_scalars, run_dirs

RUN = ["trainer.epochs=2", "trainer.batch_size=32", "trainer.log_every_n_steps=1", "trainer.checkpoint_every_n_steps=4",
       "dataset.max_train_samples=512", "dataset.max_test_samples=256", "optimizer=sgd"]
TOTAL = 32  # 16 steps per epoch


def test_runs_of_a_gpu_marked_test_ask_for_the_gpu_and_of_any_other_for_the_cpu(pytester, monkeypatch):
    """The suite pins every run's accelerator from the test's mark (tests/conftest.py): a GPU test that forgot to
    ask for the GPU trained on gloo CPU workers under the CPU pin and failed on every GPU machine. A run on the GPU
    that names no data trains on dataset=synthetic, also when the test names trainer.accelerator=gpu itself (GPU
    machines may be offline: those runs downloaded Fashion-MNIST)."""
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'tests'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")  # support/
    pytester.makepyfile(test_pins="""
        import pytest
        from support.processes import pin_accelerator

        @pytest.mark.gpu
        def test_gpu():
            assert pin_accelerator(["strategy=ddp", "x=1"]) == ["strategy=ddp", "trainer.accelerator=gpu",
                                                                "dataset=synthetic", "x=1"]
            assert pin_accelerator(["dataset=mnist"]) == ["dataset=mnist", "trainer.accelerator=gpu"]

        def test_cpu():
            assert pin_accelerator(["strategy=ddp"]) == ["strategy=ddp", "trainer.accelerator=cpu"]
            assert pin_accelerator(["trainer.accelerator=gpu"]) == ["trainer.accelerator=gpu", "dataset=synthetic"]
            assert pin_accelerator(["strategy=ddp", "trainer.accelerator=gpu", "x=1"]) == [
                "strategy=ddp", "dataset=synthetic", "trainer.accelerator=gpu", "x=1"]
            assert pin_accelerator(["trainer.accelerator=gpu", "dataset=mnist"]) == ["trainer.accelerator=gpu",
                                                                                     "dataset=mnist"]
            assert pin_accelerator(["trainer.accelerator=gpu", "experiment=dp_tutorial"]) == [
                "trainer.accelerator=gpu", "experiment=dp_tutorial"]
            assert pin_accelerator(["trainer.accelerator=cpu"]) == ["trainer.accelerator=cpu"]
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


@needs_gpu
@pytest.mark.parametrize("strategy", ["single", "dp", "ddp"])
def test_a_killed_gpu_run_resumes_and_continues_its_loss_curve(tmp_path, strategy):
    args = [f"strategy={strategy}", *RUN, "trainer.accelerator=gpu"]
    reference = tmp_path / "reference"
    reference.mkdir()
    check_ok(run_train(args, reference))
    [reference_dir] = run_dirs(reference)
    run_dir = assert_killed_run_resumes(tmp_path / "killed", args, "kill_after_step:10:0", reference_dir, TOTAL,
                                        resumed_from=8, rel=2e-2)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["device"] == "cuda" and result["resumed_from_step"] == 8 and result["steps"] == TOTAL


@needs_gpu
def test_memory_peaks_are_per_interval_so_evaluation_does_not_leak_into_training(tmp_path):
    # evaluation takes 1024 samples at a time, training 32: evaluation's peak is far above training's
    check_ok(run_train(["strategy=single", "trainer.accelerator=gpu", "trainer.epochs=2", "trainer.batch_size=32",
                        "trainer.log_every_n_steps=4", "dataset=synthetic", "dataset.train_size=512",
                        "dataset.test_size=4096"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    allocated = scalars["memory/max_allocated_gib/rank0"]
    assert "memory/max_reserved_gib/rank0" in scalars
    epoch1 = [v for step, v in allocated if step <= 16]
    epoch2 = [v for step, v in allocated if step > 16]
    assert epoch1 and epoch2
    assert max(epoch2) <= 1.5 * max(epoch1), f"epoch 1 {epoch1}, epoch 2 {epoch2}"



# the char LM's GPT at 64 x 128 tokens a step: its peak (about a GiB) dwarfs the cuBLAS and cuDNN workspaces beside it
PLANNED_GPT = ["experiment=char_lm", "model.n_layer=4", "model.n_embd=256", "model.n_head=4", "dataset.block_size=128",
               "strategy=single", "trainer.batch_size=64", "trainer.epochs=1", "trainer.max_steps=2",
               "trainer.log_every_n_steps=1", "dataset.max_test_samples=64", "trainer.progress_bar=false",
               "trainer.accelerator=gpu"]


@needs_gpu
def test_the_plan_of_a_gpu_run_is_within_10_percent_of_what_its_second_step_allocates(tmp_path):
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    text = tmp_path / "text.txt"
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(30000)))
    args = [*PLANNED_GPT, f"dataset.path={text}"]
    check_ok(run_train([*args, "+callbacks.peak._target_=cuda_probes.PeakOfStep2"], tmp_path, env=faults_env()))
    [run_dir] = run_dirs(tmp_path)
    measured = json.loads((run_dir / "probe_PeakOfStep2_rank0.json").read_text())["step2_peak_bytes"]
    traced = plan_row(composed(*args)).peak  # traced on the CPU, as plan.py plans a GPU run
    # the allocator also holds the cuBLAS workspaces (an H200 once: traced 591.3 MiB, measured 657.4)
    planned = traced + constants_of(torch.cuda.get_device_name()).allocated_beside_tensors()
    assert abs(measured - planned) <= 0.10 * planned, (
        f"plan.py planned {traced / 2**20:.1f} MiB of tensors + {(planned - traced) / 2**20:.0f} MiB of cuBLAS "
        f"workspaces, torch.cuda.max_memory_allocated over step 2 says {measured / 2**20:.1f} MiB (kernels' own "
        "buffers are not in the plan: docs/plan.md)")

@needs_gpus(2)
@pytest.mark.parametrize("key", ["compile", "activation_checkpointing"])
def test_dp_with_compile_or_activation_checkpointing_on_several_gpus_is_refused_before_training(tmp_path, key):
    proc = run_train(["strategy=dp", f"trainer.{key}=true", "trainer.accelerator=gpu", *TINY], tmp_path)
    assert proc.returncode != 0
    assert f"trainer.{key}=true is not allowed with strategy=dp on" in proc.stderr and "Traceback" not in proc.stderr


@needs_gpus(2)
@pytest.mark.parametrize("strategy", ["strategy=ddp", "strategy=deepspeed strategy.zero_stage=3"])
def test_one_visible_gpu_per_task_trains(tmp_path, strategy):
    """What SLURM's --gpus-per-task starts: every task sees one GPU as cuda:0, while its local rank counts 0, 1."""
    if "deepspeed" in strategy:
        pytest.importorskip("deepspeed")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE", "SUBMITIT_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    port = str(free_port())
    command = [sys.executable, str(TRAIN), *strategy.split(), "dataset=synthetic", *TINY, "trainer.max_steps=8",
               "trainer.accelerator=gpu"]
    tasks = run_together([(command, {**base, **slurm_task(rank, 2, str(os.getpid())), "MASTER_ADDR": "127.0.0.1",
                                     "MASTER_PORT": port, "PYTHONUNBUFFERED": "1"}) for rank in range(2)],
                         tmp_path, timeout=300)
    assert [task.returncode for task in tasks] == [0, 0], [(t.stdout, t.stderr) for t in tasks]
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == 2 and result["device"] == "cuda" and result["steps"] == 8
