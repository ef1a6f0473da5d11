"""Strategy `_target_`s of earlier hydra-dist versions, which a user's YAML or a stopped sweep's saved config may still
name: ddp and fsdp were engines of their own before they became presets of the one mesh engine, and the mesh lived in
strategies/model_parallel/ before strategies/mesh/. Each maps to what to write now (the mesh's class and the preset's
degrees where the node leaves them out), and says so in one line."""
from __future__ import annotations

from framework.config.strategy_options import MESH_TARGET, PRESETS

# the old class -> the preset whose degrees it meant (None: the same engine under its old path, degrees as written)
LEGACY_TARGETS = {
    "framework.strategies.ddp.DDPStrategy": "ddp",
    "framework.strategies.fsdp.FSDPStrategy": "fsdp",
    "framework.strategies.model_parallel.strategy.MeshStrategy": None,
}


def current_target(target: str) -> str:
    return MESH_TARGET if target in LEGACY_TARGETS else target


def modernized(node: dict) -> tuple[dict, str]:
    """A strategy node as today's engine reads it (the degrees its old class meant, where it leaves them out), and
    the line saying what to write now ('' when it names no old class)."""
    target = node.get("_target_")
    if target not in LEGACY_TARGETS:
        return node, ""
    preset = LEGACY_TARGETS[target]
    if preset is None:
        return {**node, "_target_": MESH_TARGET}, (f"strategy._target_={target} is the mesh engine's old path: write "
                                                   f"_target_: {MESH_TARGET}")
    degrees = {k: v for k, v in PRESETS[preset].items() if k not in node}
    written = " ".join(f"{k}: {v}" for k, v in degrees.items())
    note = (f"strategy._target_={target} is the old name of the mesh engine's {preset} preset: write "
            f"_target_: {MESH_TARGET}" + (f" with {written}" if written else "") +
            f" (or start from conf/strategy/{preset}.yaml)")
    return {**node, "_target_": MESH_TARGET, **degrees}, note
