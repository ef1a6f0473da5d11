"""Which engines optimizer=muon trains with, asked by the driver before any worker starts. torch.optim.Muon
orthogonalizes each 2-D matrix it is given (Newton-Schulz); that equals one process's step only where every rank
steps the whole matrices with the same averaged gradients: single, dp and ddp (tests/dist/test_muon.py proves ddp
equal to one process). Under FSDP2 and tensor parallel each rank steps its DTensor shards, and Newton-Schulz of a
shard is not the shard of the whole matrix's (a 2-rank FSDP2 check drifted 1e-2 from one process in 3 steps);
DeepSpeed hands its optimizer flattened buffers."""
from __future__ import annotations

from framework.common.errors import ConfigError
from framework.config.optimizer import MuonConfig
from framework.strategies.base import Strategy
from framework.strategies.ddp import DDPStrategy
from framework.strategies.deepspeed import DeepSpeedStrategy
from framework.strategies.dp import DataParallelStrategy
from framework.strategies.single import SingleStrategy

PROVEN = (SingleStrategy, DataParallelStrategy, DDPStrategy)


def muon_refusal(optimizer, strategy: Strategy) -> None:
    """ConfigError naming optimizer=muon and the strategy, with why, unless the engine steps whole matrices alike."""
    if not isinstance(optimizer, MuonConfig) or isinstance(strategy, PROVEN):
        return
    raise ConfigError(f"optimizer=muon is not allowed with strategy={strategy.name}: {_why(strategy)}; use "
                      "strategy=single, dp or ddp, or another optimizer")


def _why(strategy: Strategy) -> str:
    if isinstance(strategy, DeepSpeedStrategy):
        return "DeepSpeed hands its optimizer flattened parameter buffers, not the 2-D matrices torch.optim.Muon takes"
    # the mesh engine's degrees (not imported here: the mesh costs every driver seconds of imports)
    shape = getattr(strategy, "shape", None)
    shards = shape is None or shape.tp > 1 or shape.dp_shard > 1
    if strategy.checkpoint_format.sharded and shards:
        return ("each rank steps its shards of the matrices (DTensors), and Muon's Newton-Schulz of a shard is not "
                "the whole matrix's, so the run would not be the one-process run")
    return "Muon under this engine is not proven equal to one process (single, dp and ddp are)"
