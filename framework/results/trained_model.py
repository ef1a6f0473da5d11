"""A trained model back from its run folder, for inference:

    from framework.results.trained_model import load_model
    model = load_model("outputs/runs/2026-11-24_12-00-00_ddp_lenet")            # best weights, in eval mode
    model = load_model(run_folder, which="last", device="cuda")
    model = load_model(shared_run, allowed_targets=["mypkg.*"])                  # a model class of your package

The run's weights/<which>.safetensors (else .pt; framework/checkpoints/weights.py) holds the model's full state dict
with its config, input shape and class count, whatever strategy trained it (shards were gathered when it was
written). A run folder is data, not code: its model's `_target_` is built only when it is the framework's, torch's,
torchvision's, torchmetrics' or an engine's, or matches `allowed_targets` (framework/config/targets.py); anything
else is refused before it is imported."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from framework.common.errors import ConfigError
from framework.checkpoints.weights import WEIGHTS_DIR, find_weights, read_weights
from framework.config.targets import TargetAllowlist, allowing
from framework.models.build import build_model


def load_model(run_dir: str | Path, which: str = "best", device: str | torch.device = "cpu",
               allowed_targets=()) -> nn.Module:
    """The model a run trained, with its best (or last) weights, on `device`, in eval mode. `run_dir` may also be a
    weights file itself (.safetensors or .pt). allowed_targets: module patterns (mypkg.*) whose classes the run's
    model config may name, besides the built-in ones."""
    with allowing(TargetAllowlist().extended(list(allowed_targets))):
        return model_from(read_trained(run_dir, which), device)


def weights_path(run_dir: str | Path, which: str = "best") -> Path:
    """A run folder's weights/<which>.safetensors (else .pt), or `run_dir` itself when it is a file."""
    path = Path(run_dir)
    if path.is_dir():
        path = find_weights(path, (which,)) or path / WEIGHTS_DIR / f"{which}.pt"
    if not path.is_file():
        raise ConfigError(f"{path} is not there: a run writes weights/best.safetensors and .pt after an evaluation "
                          "that improved its objective, and weights/last.* when it ends")
    return path


def read_trained(run_dir: str | Path, which: str = "best") -> dict:
    """The weights file's record: the state dict ("model") and what rebuilds the model (framework/checkpoints/weights.py)."""
    return read_weights(weights_path(run_dir, which))


def model_from(saved: dict, device: str | torch.device = "cpu") -> nn.Module:
    """The model a weights record describes, built through the allowlist in force (framework/config/targets.py)."""
    model = build_model(saved["model_config"], tuple(saved["in_shape"]) if saved["in_shape"] else None,
                        saved["num_classes"])
    model.load_state_dict(saved["model"])
    return model.to(device).eval()
