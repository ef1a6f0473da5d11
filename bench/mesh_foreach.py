"""Tensor parallel without FSDP2 (issue 48, item 1): the plan leaves some parameters plain beside its DTensors, and
torch's foreach kernels refuse the mix, so the mesh engine turns foreach off on such param groups. The alternative,
every parameter a DTensor (the modules the plan leaves plain replicated on the tp mesh by distribute_module, their
inputs made Replicate DTensors and their outputs local again) with foreach on, measured against it on 2 gloo ranks:
experiment=char_lm's GPT (4 layers x 128, 4 heads, block 64, batch 8, tp=2), AdamW. Per variant: the optimizer step
alone (random gradients) and a whole training step (forward, backward, step), medians over the steps after the
warm-up, then the median of the rounds (rounds alternate the variants).

    .venv/bin/python bench/mesh_foreach.py --rounds 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchkit.commands import REPO
from benchkit.report import print_table, write_results

VARIANTS = {"engine": "plain beside DTensors, foreach off (the engine)",
            "all_dtensor": "every parameter a DTensor, foreach on"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--results-name", default="mesh_foreach")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0:
        p.error(f"--steps={args.steps} and --warmup-steps={args.warmup_steps}: the medians need a timed step")
    return args


def _model(variant: str, mesh):
    from torch.distributed.tensor import DTensor, Replicate, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from framework.models.gpt import GPT
    from framework.strategies.mesh.tensor_parallel import resolve

    torch.manual_seed(0)
    model = GPT((64,), 65, n_layer=4, n_head=4, n_embd=128)
    styles = {name: ColwiseParallel() if style == "colwise" else RowwiseParallel()
              for name, style in resolve(model, GPT.tensor_parallel_plan).items()}
    parallelize_module(model, mesh, styles)
    if variant == "all_dtensor":
        def inputs_replicated(module, inputs, device_mesh):
            return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False) if torch.is_tensor(x)
                         else x for x in inputs)

        def output_local(module, output, device_mesh):
            return output.to_local() if isinstance(output, DTensor) else output

        for module in list(model.modules()):
            if any(not isinstance(p, DTensor) for p in module.parameters(recurse=False)):
                distribute_module(module, mesh, input_fn=inputs_replicated, output_fn=output_local)
        model.head.weight = model.wte.weight  # distribute_module replaced the embedding's: tie the head again
        assert all(isinstance(p, DTensor) for p in model.parameters())
    return model


def _rank(rank: int, world: int, port: int, variant: str, steps: int, warmup: int, results) -> None:
    sys.path.insert(0, str(REPO))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_tensor

    model = _model(variant, init_device_mesh("cpu", (world,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=variant == "all_dtensor")
    tokens = torch.randint(0, 65, (8, 65), generator=torch.Generator().manual_seed(1))
    whole, alone = [], []
    for _ in range(steps + warmup):
        start = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 65), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        whole.append(time.perf_counter() - start)
    for p in model.parameters():  # the same gradients on every rank, in each parameter's own layout
        g = torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 1e-3
        p.grad = distribute_tensor(g, p.device_mesh, p.placements) if isinstance(p, DTensor) else g
    for _ in range(steps + warmup):
        start = time.perf_counter()
        optimizer.step()
        alone.append(time.perf_counter() - start)
    if rank == 0:
        results.put((statistics.median(whole[warmup:]) * 1000, statistics.median(alone[warmup:]) * 1000, float(loss)))
    dist.destroy_process_group()


def main() -> None:
    args = parse_args()
    context = mp.get_context("spawn")
    results = context.Manager().Queue()
    samples = {name: [] for name in VARIANTS}
    port = 29700
    for round_ in range(args.rounds):
        for name in VARIANTS:
            port += 1
            mp.spawn(_rank, args=(2, port, name, args.steps, args.warmup_steps, results), nprocs=2)
            step_ms, optimizer_ms, loss = results.get()
            samples[name].append({"step_ms": step_ms, "optimizer_step_ms": optimizer_ms, "loss": loss})
            print(f"  round {round_ + 1}/{args.rounds} {name}: step {step_ms:.1f} ms, optimizer step "
                  f"{optimizer_ms:.2f} ms, loss {loss:.5f}", flush=True)
    results_out, rows = {}, []
    for name, what in VARIANTS.items():
        step = statistics.median(s["step_ms"] for s in samples[name])
        alone = statistics.median(s["optimizer_step_ms"] for s in samples[name])
        results_out[name] = {"what": what, "step_ms": step, "optimizer_step_ms": alone, "samples": samples[name]}
        rows.append([name, what, step, alone])
    print_table(["variant", "parameters", "training step ms (median)", "optimizer step ms (median)"], rows)
    write_results(args.results_name, vars(args), results_out)


if __name__ == "__main__":
    main()
