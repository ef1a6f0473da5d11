"""Bench-only: each rank's own bytes of parameters and optimizer state at the end of training, into
$PARAMETER_BYTES_DIR/rank<r>.json. A callback a run names like any other, with this folder on PYTHONPATH:

    PYTHONPATH=bench/probes PARAMETER_BYTES_DIR=/tmp/x python train.py strategy=tp \
        +callbacks.bytes._target_=parameter_bytes.ParameterBytes

A DTensor counts by its local shard (tensor parallel, FSDP2); a pipeline rank holds only its stages' parameters."""
from __future__ import annotations

import json
import os
from pathlib import Path

from torch.distributed.tensor import DTensor

from framework.callbacks.base import Callback
from framework.telemetry.optimizer_state import optimizer_state_bytes


def local_bytes(tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


class ParameterBytes(Callback):
    def on_fit_end(self, state) -> None:
        record = {"parameters": sum(local_bytes(p) for p in state.model.parameters()),
                  "optimizer_state": optimizer_state_bytes(state.optimizer)}
        folder = Path(os.environ["PARAMETER_BYTES_DIR"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank{state.rank}.json").write_text(json.dumps(record))
