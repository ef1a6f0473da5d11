"""`make test-gpu`: the gpu-marked tests, then every strategy x precision on this machine's GPUs, each killed once
and resumed. Prints one table; exits non-zero when anything failed. Without a GPU it says so and runs nothing.

Per cell: a run of 16 steps (4 epochs of the same 256 samples, a checkpoint every 4 steps) is SIGKILLed after step 6
on rank 0, then started again in the same run folder. ok means: the resumed run came back from step 4, trained
exactly 16 steps, logged every step once with a finite loss, and its mean loss over the last epoch is below the first
epoch's (the same samples: one batch's loss against another's would be noise). One GPU: ddp runs 2 gloo ranks on it
(fsdp one nccl rank: FSDP's collectives on CUDA tensors want nccl, and nccl one rank per GPU). A cell that runs
past CELL_TIMEOUT_S is stopped with every process it started (the elastic agent's workers hold the GPUs) and shows
as `timeout`. A precision a strategy refuses by design shows as `-`; an optional engine that is not usable here
(not installed, or horovod built without NCCL) skips its row, said in one line, and so do the rows of bf16 compression
on GPUs without bf16 (V100, T4). A machine whose GPUs torch cannot use (a torch built for a newer CUDA than the driver
runs) fails with both versions."""
from __future__ import annotations

import importlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
STEPS, EPOCHS, KILL_AFTER, RESUMED_FROM = 16, 4, 6, 4
BATCH = 64
FAULTS = REPO / "tests" / "support" / "faults"  # the tests' fault injection callback: SIGKILL rank 0 after step KILL_AFTER
KILL = ["+callbacks.faults._target_=fault_injection.FaultInjection", f"+callbacks.faults.plan='kill_after_step:{KILL_AFTER}:0'"]
CELL_TIMEOUT_S = 300  # per run; a cell is two runs
REBUILD_HOROVOD = ".venv/bin/python -m pip uninstall -y horovod && bash scripts/setup.d/10-horovod.sh .venv"
PRECISIONS = ("fp32", "bf16", "fp16")
# dataset=synthetic: a GPU machine may have no network and no Debian datasets; learnable random images of
# Fashion-MNIST's shape, so the loss still falls.
COMMON = ["trainer.accelerator=gpu", f"trainer.epochs={EPOCHS}", f"trainer.batch_size={BATCH}",
          "trainer.log_every_n_steps=1", "trainer.checkpoint_every_n_steps=4", "dataset=synthetic",
          "dataset.shape=[1,28,28]", f"dataset.train_size={STEPS // EPOCHS * BATCH}", "dataset.test_size=512",
          "trainer.progress_bar=false"]


# Tensor and pipeline parallel need a model that has a plan and can be cut (the built-in GPT), on a text the script
# writes itself (dict-devil may be missing on a GPU machine): experiment=char_lm on words in a fixed order.
MESH_COMMON = ["experiment=char_lm", "model.n_layer=4", "model.n_embd=128", "model.n_head=4", "dataset.block_size=64",
               "trainer.accelerator=gpu", "trainer.epochs=1", "trainer.batch_size=64", "trainer.log_every_n_steps=1",
               "trainer.checkpoint_every_n_steps=4", f"trainer.max_steps={STEPS}", "lr_schedule=constant",
               "dataset.max_test_samples=64", "trainer.progress_bar=false"]


class CellTimeout(Exception):
    pass


class LeftProcesses(Exception):
    """A run ended and left processes of its own running (a worker holding a GPU)."""


def strategies(gpus: int) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    """name -> (overrides, the precisions it trains in: fsdp refuses fp16, which needs a loss scaler for sharded
    gradients; cpu_offload runs once, in bf16; deepspeed refuses fp16 with ZeRO 1-3, whose optimizer clips the
    still-scaled gradients, so fp16 runs at ZeRO 0)."""
    fsdp = ["strategy=fsdp"] if gpus > 1 else ["strategy=fsdp", "strategy.nproc_per_node=1"]
    ddp = ["strategy=ddp"] if gpus > 1 else ["strategy=ddp", "strategy.nproc_per_node=2", "strategy.backend=gloo"]
    return {
        "single": (["strategy=single"], PRECISIONS),
        "dp": (["strategy=dp"], PRECISIONS),
        "ddp": (ddp, PRECISIONS),
        "fsdp": (fsdp, ("fp32", "bf16")),
        "fsdp cpu_offload": ([*fsdp, "strategy.cpu_offload=true"], ("bf16",)),
        "deepspeed z0": (["strategy=deepspeed", "strategy.zero_stage=0"], ("fp16",)),
        "deepspeed z2": (["strategy=deepspeed", "strategy.zero_stage=2"], ("fp32", "bf16")),
        "deepspeed z3": (["strategy=deepspeed", "strategy.zero_stage=3"], ("fp32", "bf16")),
        "horovod": (["strategy=horovod"], PRECISIONS),
        **compression_cells(ddp, fsdp),
    }


def compression_cells(ddp: list[str], fsdp: list[str]) -> dict[str, tuple[list[str], tuple[str, ...]]]:
    """strategy.compression on the GPUs: ddp's fp16 and bf16 hooks (bf16 gradients in a bf16 run, so the row is
    left out where the GPUs have no bf16), PowerSGD from step 3 (so the kill after step 6 and the resume from step 4
    carry its error feedback and warm-start factors), fsdp's bf16 reduce-scatter and Horovod's fp16 compressor."""
    return {
        "ddp compression=fp16": ([*ddp, "strategy.compression=fp16"], ("fp32",)),
        "ddp compression=bf16": ([*ddp, "strategy.compression=bf16"], ("bf16",)),
        "ddp compression=powersgd": ([*ddp, "strategy.compression=powersgd", "strategy.powersgd.start_step=3"],
                                     ("fp32",)),
        "fsdp compression=bf16": ([*fsdp, "strategy.compression=bf16"], ("fp32", "bf16")),
        "horovod compression=fp16": (["strategy=horovod", "strategy.compression=fp16"], ("fp32",)),
    }


def mesh_strategies(gpus: int) -> dict[str, tuple[list[str] | None, tuple[str, ...]]]:
    """strategy=tp and strategy=pp over 2 GPUs (nccl, one rank per GPU; fp16 is refused by design), their compile and
    activation checkpointing (tensor parallel's DTensor blocks compiled and recomputed), a zero-bubble schedule
    (ZBVZeroBubble: 2 stages per rank in a V, backward split into input and weight gradients), and FSDP2 x tp on 4;
    None: this machine has too few GPUs."""
    two = ["strategy.nproc_per_node=2"] if gpus >= 2 else None
    speedups = ["trainer.compile=true", "trainer.activation_checkpointing=true"]
    return {
        "tp (tp=2)": (two and ["strategy=tp", "strategy.tp=2", *two], ("fp32", "bf16")),
        "pp (pp=2, 1F1B)": (two and ["strategy=pp", "strategy.pp=2", "strategy.schedule=1F1B", *two], ("fp32", "bf16")),
        "tp (tp=2) compile + recompute": (two and ["strategy=tp", "strategy.tp=2", *two, *speedups], ("bf16",)),
        "pp (pp=2, ZBVZeroBubble)": (two and ["strategy=pp", "strategy.pp=2", "strategy.schedule=ZBVZeroBubble", *two],
                                     ("bf16",)),
        "tp x dp_shard (2 x 2)": (["strategy=tp", "strategy.tp=2", "strategy.dp_shard=2", "strategy.nproc_per_node=4"]
                                  if gpus >= 4 else None, ("fp32", "bf16")),
    }


def write_text(path: Path) -> Path:
    """About 200 KB of words in a fixed order: enough 64-character blocks for 16 steps of 64, and learnable."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma".split()
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(30000)))
    return path


def missing_engine(name: str) -> str | None:
    """Why an optional engine's row cannot run here (setup builds engines only with `make setup`), or None."""
    module = {"deepspeed": "deepspeed", "horovod": "horovod.torch"}.get(name.split()[0])
    if module is None:
        return None
    try:
        engine = importlib.import_module(module)
    except Exception as exc:  # an engine built for another torch fails in many ways
        return f"skipped: {module} not usable ({str(exc).splitlines()[0][:60]}); make setup installs it"
    if module == "horovod.torch" and not engine.nccl_built():
        return "skipped: horovod was built without NCCL; rebuild it on this GPU machine: " + REBUILD_HOROVOD
    return None


def train(args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """train.py in a process group of its own, so that a run past its time ends with every worker it started."""
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        out, err = proc.communicate(timeout=CELL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise CellTimeout from None
    if not _group_ends(proc.pid, seconds=10):
        os.killpg(proc.pid, signal.SIGKILL)
        raise LeftProcesses
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _group_ends(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def last_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in (proc.stderr + proc.stdout).splitlines() if "error" in line.lower()]
    return (lines[-1] if lines else f"exit {proc.returncode}").strip()[:90]


def losses(run_dir: Path) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars("loss/train")}


def cell(args: list[str], work: Path) -> str:
    try:
        return checked_cell(args, work)
    except CellTimeout:
        return f"timeout: a run took over {CELL_TIMEOUT_S} s; stopped with all its processes"
    except LeftProcesses:
        return "failed: a run ended and left processes of its own running (stopped now)"


def checked_cell(args: list[str], work: Path) -> str:
    """args: the run's whole command line (plan's); the first run is killed, the second resumes it."""
    work.mkdir(parents=True)
    killed = train([*args, *KILL], work, env={"PYTHONPATH": os.pathsep.join(filter(None, [str(FAULTS), os.environ.get(
        "PYTHONPATH")]))})
    folders = [p.parent for p in (work / "outputs").rglob(".hydra")]
    if killed.returncode == 0 or len(folders) != 1:
        return f"failed: first run {'was not killed' if killed.returncode == 0 else last_error(killed)}"
    resumed = train([*args, f"hydra.run.dir={folders[0]}"], work)
    if resumed.returncode != 0:
        return f"failed: resume: {last_error(resumed)}"
    result = json.loads((folders[0] / "result.json").read_text())
    curve = losses(folders[0])
    problems = []
    if result["resumed_from_step"] != RESUMED_FROM or result["steps"] != STEPS:
        problems.append(f"resumed from {result['resumed_from_step']}, {result['steps']} steps")
    if sorted(curve) != list(range(1, STEPS + 1)) or not all(math.isfinite(v) for v in curve.values()):
        problems.append("loss curve has gaps or NaN")
    else:
        per_epoch = STEPS // EPOCHS
        first, last = (sum(curve[s] for s in steps) / per_epoch for steps in
                       (range(1, per_epoch + 1), range(STEPS - per_epoch + 1, STEPS + 1)))
        if last >= first:
            problems.append(f"loss did not fall (epoch means {first:.3f} -> {last:.3f})")
    if problems:
        return "failed: " + "; ".join(problems)
    rates = "/".join(f"{r:,.0f}" for r in result["per_rank_samples_per_sec"])
    memory = "/".join(f"{m:.2f}" for m in result.get("per_rank_max_memory_gib", []))
    return f"ok {rates} samples/s, {memory} GiB"


def skip_reason(name: str, args: list[str] | None, bf16: bool) -> str | None:
    """Why a row runs none of its cells on this machine, or None."""
    if args is None:
        return f"skipped: needs {4 if 'dp_shard' in name else 2} GPUs"
    if not bf16 and "strategy.compression=bf16" in args:
        return "skipped: bf16 compression needs GPUs with bf16 (torch.cuda.is_bf16_supported) and NCCL >= 2.10"
    return missing_engine(name)


def plan(gpus: int, bf16: bool, text: Path) -> tuple[list[str], dict[str, str], dict[tuple[str, str], list[str] | str]]:
    """The matrix on `gpus` GPUs, with bf16 or without (V100, T4): its precisions (columns), each skipped row's
    reason, and each cell's whole train.py command line, or its mark where it does not run ('-': a precision the
    strategy refuses by design; 'skipped'). text: the mesh cells' text (write_text)."""
    precisions = [p for p in PRECISIONS if p != "bf16" or bf16]
    meshes = mesh_strategies(gpus)
    mesh_common = [*MESH_COMMON, f"dataset.path={text}"]
    skips, cells = {}, {}
    for name, (strategy_args, trains_in) in {**strategies(gpus), **meshes}.items():
        skip = skip_reason(name, strategy_args, bf16)
        if skip:
            skips[name] = skip
        for precision in precisions:
            if precision not in trains_in:
                cells[name, precision] = "-"
            elif skip:
                cells[name, precision] = "skipped"
            else:
                cells[name, precision] = [*strategy_args, *(mesh_common if name in meshes else COMMON),
                                          f"trainer.precision={precision}"]
    return precisions, skips, cells


def driver_cuda() -> str:
    """The newest CUDA the NVIDIA driver runs (NVML, else nvidia-smi -q), or 'unknown'."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetCudaDriverVersion()
        return f"{version // 1000}.{version % 1000 // 10}"
    except Exception:  # no nvidia-ml-py, or NVML cannot reach a driver: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=20).stdout
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return "unknown"
    found = re.search(r"CUDA Version\s*:\s*([\d.]+)", out)
    return found.group(1) if found else "unknown"


def unusable_gpus() -> str | None:
    """Where torch sees no GPU but the machine has NVIDIA GPUs (a torch built for a newer CUDA than the driver
    runs, or a CPU-only torch): the line that fails make test-gpu; None where there are none."""
    from framework.results.provenance import gpus

    found = gpus()["devices"]
    if not found:
        return None
    driver = found[0].get("driver", "of unknown version")
    built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (f"make test-gpu: FAILED: this machine has {len(found)} NVIDIA GPU(s) and torch {torch.__version__} "
            f"({built}) cannot use them: the driver {driver} runs CUDA up to {driver_cuda()}; install a torch built "
            "for that CUDA or older, or a newer driver")


def main() -> int:
    if not torch.cuda.is_available():
        unusable = unusable_gpus()
        if unusable:
            print(unusable)
            return 1
        print("make test-gpu: no CUDA GPU is visible on this machine, so there is nothing to run (exit 0)")
        return 0
    gpus = torch.cuda.device_count()
    print(f"make test-gpu: {gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    tests = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"], cwd=REPO)
    table = {}
    # One cell at a time: each measures samples/s and memory per GPU, which cells sharing the GPUs would distort.
    with tempfile.TemporaryDirectory(prefix="hydra-dist-gpu-smoke-") as tmp:
        precisions, skips, cells = plan(gpus, torch.cuda.is_bf16_supported(including_emulation=False),
                                        write_text(Path(tmp) / "text.txt"))
        rows = list(dict.fromkeys(name for name, _ in cells))
        for name in rows:
            if name in skips:
                print(f"  {name}: {skips[name]}", flush=True)
            for precision in precisions:
                args = cells[name, precision]
                if isinstance(args, str):
                    table[name, precision] = args
                    continue
                work = Path(tmp) / f"{name.replace(' ', '_').replace('(', '').replace(')', '')}-{precision}"
                table[name, precision] = cell(args, work)
                print(f"  {name} {precision}: {table[name, precision]}", flush=True)
    width = max(len(v) for v in table.values())
    print(f"\n| strategy | {' | '.join(p.ljust(width) for p in precisions)} |")
    print("|---" * (len(precisions) + 1) + "|")
    for name in rows:
        print(f"| {name} | {' | '.join(table[name, p].ljust(width) for p in precisions)} |")
    print("\nok: samples/s per GPU (rank), peak allocated memory per GPU; each cell killed after step "
          f"{KILL_AFTER} and resumed from step {RESUMED_FROM}; skipped: a row this machine cannot run (why: above)")
    bad = [v for v in table.values() if v.startswith(("failed", "timeout"))]
    failed = tests.returncode not in (0, 5) or bool(bad)
    print(f"gpu tests: {'passed' if tests.returncode in (0, 5) else 'FAILED'}; matrix: "
          f"{sum(v.startswith('ok') for v in table.values())} ok, {len(bad)} failed or timed out")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
