"""Which engines optimizer=muon trains with, asked by the driver before any worker starts. torch.optim.Muon
orthogonalizes each 2-D matrix it is given (Newton-Schulz); that equals one process's step only where every rank
steps the whole matrices with the same averaged gradients: single, dp and ddp (tests/dist/test_muon.py proves ddp
equal to one process). Under FSDP2 and tensor parallel each rank steps its DTensor shards, and Newton-Schulz of a
shard is not the shard of the whole matrix's (a 2-rank FSDP2 check drifted 1e-2 from one process in 3 steps);
DeepSpeed hands its optimizer flattened buffers. Each engine says which it does (Strategy.muon_steps)."""
from __future__ import annotations

from framework.common.errors import ConfigError
from framework.config.optimizer import MuonConfig
from framework.strategies.base import Strategy

WHY = {
    "flat": "DeepSpeed hands its optimizer flattened parameter buffers, not the 2-D matrices torch.optim.Muon takes",
    "shards": ("each rank steps its shards of the matrices (DTensors), and Muon's Newton-Schulz of a shard is not "
               "the whole matrix's, so the run would not be the one-process run"),
    "unproven": "Muon under this engine is not proven equal to one process (single, dp and ddp are)",
}


def muon_refusal(optimizer, strategy: Strategy) -> None:
    """ConfigError naming optimizer=muon and the strategy, with why, unless the engine steps whole matrices alike."""
    if not isinstance(optimizer, MuonConfig) or strategy.muon_steps == "whole":
        return
    raise ConfigError(f"optimizer=muon is not allowed with strategy={strategy.name}: {WHY[strategy.muon_steps]}; use "
                      "strategy=single, dp or ddp, or another optimizer")
