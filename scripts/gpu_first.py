"""scripts/gpu_first.sh's checks: the CUDA paths the desk reviews found most at risk, one line each, highest risk
first, inside a time budget (a GPU is lent for minutes): a check that would not finish before the deadline is not
started and says so. Exit 1 when a check failed.

    powersgd fp16 overflow    ddp with PowerSGD from step 3 in fp16, the loss NaN at step 5 (the tests' fault
                              injection), trainer.on_nonfinite=skip: the steps after it must train again
    resnet18 compression      ResNet-18 on one GPU (ddp, nccl) with compression none, fp16 and powersgd: ms per step,
                              torch.cuda.synchronize calls per step (PowerSGD's hook makes one per bucket), and
                              max_memory_allocated over the last checkpoint's save (tests/support/faults/cuda_probes.py)
    fsdp bf16 accumulation    strategy=fsdp strategy.compression=bf16 on a 1-rank nccl group: 8 micro-batches, 7
                              without sync, summed in fp32 (in bf16 the 7 small ones vanish)
    verify tf32               verify.py on a CNN without BatchNorm or dropout, ddp over 2 gloo ranks on the GPU, fp32:
                              the step-1 gap and the cause it finds (TF32 convolutions: the exact_kernels experiment)
    deterministic twice       ResNet-18 on one GPU with trainer.deterministic=true (cuDNN deterministic and untimed,
                              CUBLAS_WORKSPACE_CONFIG, torch's deterministic mode), trained twice: the same train
                              loss and the same bits in the last checkpoint's model and optimizer tensors
    invariant twice           the char LM with dropout under trainer.invariant (8 micro-shards, dropout keyed per
                              shard on the GPU's generator, the fixed-point sum) on one GPU twice, and with 2 GPUs or
                              more also under ddp on 2: every step's loss and the last checkpoint's tensors bitwise
                              equal (docs/invariant.md)
    gpu_smoke <row> <prec>    make test-gpu's cells on one GPU (scripts/gpu_smoke.py), killed and resumed, while
                              time is left
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

from framework.checkpoints.digest import state_digest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_smoke  # noqa: E402  (this folder's other script: its cells, runs and fault injection)

REPO = gpu_smoke.REPO
PROBES = REPO / "tests" / "support" / "faults"  # cuda_probes.py and fault_injection.py
SMALL = ["model=simple_cnn", "dataset=synthetic", "dataset.shape=[1,28,28]", "dataset.train_size=1024",
         "dataset.test_size=256", "trainer.batch_size=64", "trainer.log_every_n_steps=1", "trainer.progress_bar=false",
         "trainer.accelerator=gpu"]
# 30 steps of 128, one epoch: its end is the one checkpoint (the save PeakAtSave measures)
RESNET = ["model=resnet18", "dataset=synthetic", "dataset.shape=[3,32,32]", "dataset.train_size=3840",
          "dataset.test_size=256", "trainer.batch_size=128", "trainer.epochs=1", "trainer.log_every_n_steps=10",
          "trainer.progress_bar=false", "trainer.accelerator=gpu"]
ONE_GPU_DDP = ["strategy=ddp", "strategy.nproc_per_node=1"]
PROBED = ["+callbacks.syncs._target_=cuda_probes.SyncsPerStep", "+callbacks.peak._target_=cuda_probes.PeakAtSave"]
OVERFLOW = [*ONE_GPU_DDP, *SMALL, "strategy.compression=powersgd", "strategy.powersgd.start_step=3",
            "trainer.precision=fp16", "trainer.on_nonfinite=skip", "trainer.max_steps=12",
            "+callbacks.faults._target_=fault_injection.FaultInjection", "+callbacks.faults.plan='nan_loss:5:0'"]
# a CNN without BatchNorm or dropout: a gap at step 1 is the kernels' (TF32, cuDNN's per-shape choice) alone
VERIFY = ["model=simple_cnn", *RESNET[1:], "strategy=ddp", "strategy.nproc_per_node=2", "strategy.backend=gloo",
          "trainer.precision=fp32", "verify.steps=3"]
# 10 steps of 128: convolutions (cuDNN), the head's matmul (cuBLAS) and BatchNorm, twice
DETERMINISTIC = ["strategy=single", "trainer.deterministic=true", "dataset.train_size=1280",
                 *[o for o in RESNET if not o.startswith("dataset.train_size=")]]
# 10 steps of 64 as 8 micro-shards of 8, on the text gpu_smoke writes (invariant_runs adds its dataset.path)
INVARIANT = ["experiment=char_lm", "model.n_layer=2", "model.n_embd=64", "model.n_head=4", "model.dropout=0.1",
             "dataset.block_size=64", "dataset.max_test_samples=64", "trainer.invariant=true", "trainer.micro_shards=8",
             "trainer.deterministic=true", "trainer.batch_size=64", "trainer.epochs=1", "trainer.max_steps=10",
             "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.accelerator=gpu"]


class Check(NamedTuple):
    name: str
    seconds: float  # what it takes on an H100, about, with its processes' start: not started with less time left
    commands: list[tuple[str, list[str]]] = []  # (train.py | verify.py, overrides) it starts


def checks(gpus: int = 1) -> list[Check]:
    """The checks before gpu_smoke's cells, in order, with the command lines they start on a machine of `gpus` GPUs
    (tested on CPU: tests/unit/test_gpu_first.py)."""
    compressed = [("none", []), ("fp16", []), ("powersgd", ["strategy.powersgd.start_step=3"])]
    invariant = [("train.py", [*INVARIANT, "strategy=single"])] * 2
    if gpus >= 2:
        invariant.append(("train.py", [*INVARIANT, "strategy=ddp", "strategy.nproc_per_node=2"]))
    return [
        Check("powersgd fp16 overflow", 40, [("train.py", OVERFLOW)]),
        Check("resnet18 compression", 90, [("train.py", [*ONE_GPU_DDP, *RESNET, *PROBED, f"strategy.compression={c}",
                                                         *extra]) for c, extra in compressed]),
        Check("fsdp bf16 accumulation", 20),
        Check("verify tf32", 120, [("verify.py", VERIFY)]),
        Check("deterministic twice", 50, [("train.py", DETERMINISTIC)] * 2),
        Check("invariant twice", 35 if gpus < 2 else 55, invariant),
    ]


def start(tool: str, overrides: list[str], folder: Path, timeout: float) -> tuple[subprocess.CompletedProcess, Path]:
    """tool (train.py, verify.py) in `folder`, the probes and fault injection importable; its run folder."""
    run_dir = folder / "run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROBES), str(REPO), os.environ.get("PYTHONPATH")]))}
    folder.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, str(REPO / tool), *overrides, f"hydra.run.dir={run_dir}"], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=timeout)
    (folder / f"{tool}.log").write_text(proc.stdout + proc.stderr)
    return proc, run_dir


def _probe(run_dir: Path) -> dict:
    """What rank 0's probes found (tests/support/faults/cuda_probes.py)."""
    found = {}
    for path in run_dir.glob("probe_*_rank0.json"):
        found.update(json.loads(path.read_text()))
    return found


def powersgd_overflow(check: Check, work: Path, timeout: float) -> str:
    proc, run_dir = start(*check.commands[0], work, timeout)
    if proc.returncode != 0:
        return f"failed: {gpu_smoke.last_error(proc)}"
    result = json.loads((run_dir / "result.json").read_text())
    skipped = result["skipped_steps"]
    # the NaN's step, and at most one of GradScaler's own (its scale halves after an overflow); a state that never
    # recovers skips every step after step 5
    return (f"{'ok' if skipped <= 2 else 'failed'}: {skipped} of {result['steps']} steps skipped (expected: step 5's "
            "NaN, and at most one overflow of GradScaler's own)")


def resnet_compression(check: Check, work: Path, timeout: float) -> str:
    parts, failed = [], False
    for (tool, overrides) in check.commands:
        compression = next(o.split("=", 1)[1] for o in overrides if o.startswith("strategy.compression="))
        proc, run_dir = start(tool, overrides, work / compression, timeout)
        if proc.returncode != 0:
            parts.append(f"{compression} failed: {gpu_smoke.last_error(proc)}")
            failed = True
            continue
        result, probe = json.loads((run_dir / "result.json").read_text()), _probe(run_dir)
        parts.append(f"{compression} {1000 * result['train_seconds'] / result['steps']:.1f} ms/step, "
                     f"{probe.get('syncs_per_step', float('nan')):.1f} syncs/step, "
                     f"{probe.get('peak_gib_at_save', float('nan')):.2f} GiB peak at save")
    return ("failed: " if failed else "ok: ") + " | ".join(parts)


def fsdp_accumulation(check: Check, work: Path, timeout: float) -> str:
    """In a child (its own nccl group of one rank): scripts/gpu_first.py --fsdp-accumulation."""
    proc = subprocess.run([sys.executable, __file__, "--fsdp-accumulation"], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              filter(None, [str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH")]))})
    work.mkdir(parents=True, exist_ok=True)
    (work / "fsdp.log").write_text(proc.stdout + proc.stderr)
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else f"failed: {gpu_smoke.last_error(proc)}"


def accumulated_in_one_rank(accelerator: str = "gpu") -> str:
    """The dist test's arithmetic (tests/dist/test_fsdp_units.py) on the GPU: gradient 1, then 7 x 2^-9. On the CPU
    (gloo) only to show in a unit test that the check still builds the engine as it is today."""
    import torch.distributed as dist

    from framework.strategies.mesh.dims import MeshGroup
    from support.driver import strategy_for

    device = torch.device("cuda", 0) if accelerator == "gpu" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1,
                            store=dist.HashStore(), device_id=device if device.type == "cuda" else None)
    try:
        strategy = strategy_for("strategy=fsdp", "strategy.nproc_per_node=1", f"trainer.accelerator={accelerator}",
                                "strategy.compression=bf16", "trainer.precision=bf16")
        model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False))
        wrapped = strategy.parallelize(model, lambda params, **_: torch.optim.SGD(params, lr=0.1),
                                       MeshGroup(0, 0, 1, device).on_mesh(strategy.dims))
        for micro_batch in range(8):
            wrapped.gradient_sync(micro_batch == 7)
            x = torch.full((1, 2), 1.0 if micro_batch == 0 else 2.0 ** -9, device=device)
            wrapped.model(x).float().sum().backward()
        grad = wrapped.model[0].weight.grad
        if not hasattr(grad, "full_tensor"):
            return ("not run: the fsdp preset on one rank shards nothing (no FSDP2, no bf16 reduce to accumulate); "
                    "tests/dist/test_fsdp_units.py has the arithmetic on 2 gloo ranks")
        got = sorted(set(grad.full_tensor().flatten().tolist()))
    finally:
        dist.destroy_process_group()
    fp32_sum = 1 + 7 * 2.0 ** -9
    return (f"{'ok' if got == [fp32_sum] else 'failed'}: 8 micro-batches summed to {got} (fp32: {fp32_sum}; "
            "bf16 would keep 1.0)")


def verify_tf32(check: Check, work: Path, timeout: float) -> str:
    proc, _ = start(*check.commands[0], work, timeout)
    said = [line for line in proc.stdout.splitlines() if line.startswith("verify: ")]
    first = next((line for line in said if "differs" in line or "equal" in line), "no verdict")
    last = said[-1] if said else gpu_smoke.last_error(proc)
    said = first[8:] if first == last else f"{first[8:]} || {last[8:]}"
    return f"{'ok' if proc.returncode in (0, 1) else 'failed'} (exit {proc.returncode}): {said}"


def _last(run_dir: Path) -> Path:
    """The run's last checkpoint."""
    return sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1]


def deterministic_twice(check: Check, work: Path, timeout: float) -> str:
    seen = []
    for i, (tool, overrides) in enumerate(check.commands):
        proc, run_dir = start(tool, overrides, work / f"run{i}", timeout)
        if proc.returncode != 0:
            return f"failed: {gpu_smoke.last_error(proc)}"
        seen.append((json.loads((run_dir / "result.json").read_text())["train_loss"], state_digest(_last(run_dir))))
    (loss, digest), (other_loss, other_digest) = seen
    same = loss == other_loss and digest == other_digest
    return (f"{'ok' if same else 'failed'}: train loss {loss!r} and {other_loss!r}, last checkpoint's tensors "
            f"{'bitwise equal' if digest == other_digest else 'different'}")


def invariant_runs(check: Check, work: Path, timeout: float) -> str:
    work.mkdir(parents=True, exist_ok=True)
    text = gpu_smoke.write_text(work / "text.txt")
    seen = {}
    for i, (tool, overrides) in enumerate(check.commands):
        label = f"run {i + 1} ({'ddp x2' if 'strategy=ddp' in overrides else 'single'})"
        proc, run_dir = start(tool, [*overrides, f"dataset.path={text}"], work / f"run{i}", timeout)
        if proc.returncode != 0:
            return f"failed: {label}: {gpu_smoke.last_error(proc)}"
        seen[label] = (gpu_smoke.losses(run_dir), state_digest(_last(run_dir)))
    return invariant_verdict(seen)


def invariant_verdict(seen: dict[str, tuple[dict[int, float], str]]) -> str:
    """seen: each run's logged loss by step and its last checkpoint's digest, the first run the reference."""
    (first, (losses, digest)), *others = seen.items()
    if not losses:
        return f"failed: {first} logged no loss"
    problems = []
    for label, (other_losses, other_digest) in others:
        steps = [s for s in sorted(set(losses) | set(other_losses)) if losses.get(s) != other_losses.get(s)]
        if steps:
            problems.append(f"{label}'s loss differs from {first}'s from step {steps[0]}")
        if other_digest != digest:
            problems.append(f"{label}'s last checkpoint's tensors differ from {first}'s")
    if problems:
        return "failed: " + "; ".join(problems)
    return (f"ok: {', '.join(seen)}: {len(losses)} steps' losses and the last checkpoint's model and optimizer "
            "tensors bitwise equal")


RUNNERS = {"powersgd fp16 overflow": powersgd_overflow, "resnet18 compression": resnet_compression,
           "fsdp bf16 accumulation": fsdp_accumulation, "verify tf32": verify_tf32,
           "deterministic twice": deterministic_twice, "invariant twice": invariant_runs}


def main(deadline: float) -> int:
    if not torch.cuda.is_available():
        print(gpu_smoke.unusable_gpus() or "gpu_first: no CUDA GPU is visible on this machine, nothing to check")
        return 1
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    print(f"gpu_first: {torch.cuda.get_device_name(0)}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"bf16 {'yes' if bf16 else 'no'}; {deadline - time.time():.0f} s left", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="hydra-dist-gpu-first-") as tmp:
        for check in checks(torch.cuda.device_count()):
            left = deadline - time.time()
            if left < check.seconds:
                print(f"{check.name}: not run ({left:.0f} s left, it takes about {check.seconds:.0f})", flush=True)
                continue
            began = time.time()
            try:
                line = RUNNERS[check.name](check, Path(tmp) / check.name.replace(" ", "_"), left)
            except subprocess.TimeoutExpired:
                line = "failed: past the deadline"
            failed |= not line.startswith("ok")
            print(f"{check.name}: {line} [{time.time() - began:.0f} s]", flush=True)
        _, skips, cells = gpu_smoke.plan(1, bf16, gpu_smoke.write_text(Path(tmp) / "text.txt"))
        for (name, precision), args in cells.items():
            if isinstance(args, str):
                continue
            left = deadline - time.time()
            if left < 40:
                print(f"gpu_smoke {name} {precision}: not run ({left:.0f} s left)", flush=True)
                continue
            gpu_smoke.CELL_TIMEOUT_S = max(1, int(left / 2))  # a cell is two runs
            began = time.time()
            line = gpu_smoke.cell(args, Path(tmp) / f"smoke-{len(os.listdir(tmp))}")
            failed |= not line.startswith("ok")
            print(f"gpu_smoke {name} {precision}: {line} [{time.time() - began:.0f} s]", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--fsdp-accumulation"]:
        sys.path.insert(0, str(REPO / "tests"))
        print(accumulated_in_one_rank())
        sys.exit(0)
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else time.time() + 420))
