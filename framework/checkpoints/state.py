"""The loop's own part of a checkpoint: every rank's RNG states, the data position and the run totals (a strategy's
CheckpointIO adds model and optimizer), and the signature a checkpoint must match to be resumed. Only tensors and
plain Python values, so torch.load(weights_only=True) can read it."""
from __future__ import annotations

import random
from dataclasses import asdict

import numpy as np
import torch

from framework.checkpoints.position import Position


def rng_state(cuda_devices: list[int] = ()) -> dict:
    """Every RNG stream this process draws from: Python, NumPy, torch's CPU generator and the generator of
    each GPU in `cuda_devices` (the GPUs this process trains on: dp's replicas use one each)."""
    version, keys, gauss = random.getstate()
    kind, np_keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(keys), gauss],
        "numpy": {"keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if cuda_devices:
        state["cuda"] = {int(d): torch.cuda.get_rng_state(d) for d in cuda_devices}
    return state


def restore_rng(state: dict, cuda_devices: list[int] = ()) -> None:
    """The inverse of rng_state. Generator states must be CPU ByteTensors, wherever the checkpoint was mapped."""
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].cpu().numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"].cpu())
    for device, generator_state in state.get("cuda", {}).items():
        if int(device) in cuda_devices:  # a GPU this run no longer uses keeps its own stream
            torch.cuda.set_rng_state(generator_state.cpu(), int(device))


def signature(model: dict, dataset_name: str, optimizer_target: str, in_shape, num_classes: int,
              param_groups: list | None = None, lr_scheduler: dict | None = None) -> dict:
    """What must match for a checkpoint to be resumable by this run: the model's config, the dataset, the input
    shape and classes, the optimizer class; and, where the run has them, its optimizer.param_groups (the optimizer
    state is kept per group) and its torch lr scheduler (whose saved state would replace its arguments)."""
    ours = {"model": model, "dataset": dataset_name, "in_shape": list(in_shape) if in_shape else None,
            "num_classes": num_classes, "optimizer": optimizer_target}
    if param_groups:
        ours["param_groups"] = param_groups
    if lr_scheduler:
        ours["lr_scheduler"] = lr_scheduler
    return ours


def signature_mismatch(saved: dict, current: dict) -> str | None:
    diffs = [f"{key}: checkpoint has {saved.get(key)!r}, this run has {value!r}"
             for key, value in current.items() if saved.get(key) != value]
    return "; ".join(diffs) or None


def loop_state(position: Position, totals: dict, rng_states: list[dict], scaler, callbacks: dict,
               lr_schedule: dict | None = None, engine: list | None = None) -> dict:
    """The loop's own part of a checkpoint: everything but model and optimizer (a sharded checkpoint's
    training_state.pt holds just this); `callbacks`: each callback's state_dict() by its name; `lr_schedule`: a torch
    lr scheduler's state_dict() (None for the built-in schedules, a function of the step); `engine`: every rank's
    state of an engine that keeps its own (ddp's PowerSGD), in rank order, or None."""
    return {"position": asdict(position), "totals": totals, "rng": rng_states,
            "scaler": scaler.state_dict() if scaler else None, "callbacks": callbacks, "lr_schedule": lr_schedule,
            "engine": engine}


def restore_progress(state: dict, rank: int, world_size: int, cuda_devices: list[int] = ()) -> tuple[Position, dict]:
    """RNG streams, data position and run totals. Each rank continues its own RNG streams when the world size is
    the one saved; on another world size every rank continues rank 0's, as a fresh run starts every rank from the
    same seed."""
    rngs = state["rng"]
    restore_rng(rngs[rank] if len(rngs) == world_size else rngs[0], cuda_devices)
    return Position.from_saved(state["position"]), state.get("totals", {})
