"""A HuggingFace transformers model's weights in its own format beside weights/*.pt: `<run folder>/pretrained/<name>/`
(save_pretrained: config.json and model.safetensors), loadable with `<ModelClass>.from_pretrained(folder)` without
hydra-dist. Written by rank 0 from the full state dict the weights file holds (gathered where a strategy shards the
model), into a temporary folder renamed into place, so a reader never sees half of one."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

PRETRAINED_DIR = "pretrained"


def is_pretrained_model(module) -> bool:
    """A transformers PreTrainedModel, also once fully_shard has given it a class of its own (known by its classes'
    names, so transformers is never imported for the check)."""
    return callable(getattr(module, "save_pretrained", None)) and any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(module).__mro__)


def write_pretrained(run_dir: Path, name: str, module, state: dict) -> Path:
    folder = run_dir / PRETRAINED_DIR / name
    partial = folder.with_name(f".{name}.tmp")
    shutil.rmtree(partial, ignore_errors=True)
    with _no_progress_bar():  # transformers draws a bar for each shard it writes, at every best and last save
        module.save_pretrained(partial, state_dict=state)
    old = folder.with_name(f".{name}.old")
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _no_progress_bar():
    from transformers.utils import logging  # optional library (the hf extra): the model being saved imported it

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()
