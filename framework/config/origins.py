"""Where a key of the composed config came from, to explain a refusal: an override on the command line, or the YAML
of an entry Hydra composed, either a group's option (loss=cross_entropy: conf/loss/cross_entropy.yaml) or a preset
that sets keys anywhere (experiment=..., `# @package _global_`). Read from Hydra's own record of the composition
(HydraConfig: its choices, the user's overrides and the config folders it searched, in its order: conf/, a
--config-dir, hydra.searchpath); unknown outside a Hydra app, or for an entry that is not a file. Also the overrides
that start the key's group from its `custom` entry instead (framework/config/custom_entry.py), keeping the user's
own overrides of that group."""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from framework.config.custom_entry import CUSTOM

_PACKAGE = re.compile(r"#\s*@package\s+(\S+)")


@dataclass(frozen=True)
class Origin:
    said: str  # "loss=cross_entropy (conf/loss/cross_entropy.yaml)" or "the command line (+loss.foo=1)"
    kind: str  # COMMAND_LINE, OPTION (the group's chosen entry) or PRESET (an entry of the global package)


COMMAND_LINE, OPTION, PRESET = "command line", "option", "preset"


@dataclass(frozen=True)
class _Composition:
    choices: dict  # group -> option, as Hydra chose them
    overrides: list  # the user's overrides, parsed (hydra.core.override_parser.types.Override)
    folders: list  # the config folders Hydra searched, in its order


def _composition() -> _Composition | None:
    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    overrides = OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task))
    folders = [Path(s.path) for s in hydra_cfg.runtime.config_sources if s.schema == "file"]
    return _Composition(dict(hydra_cfg.runtime.choices), overrides, folders)


def origin_of(path: str) -> Origin | None:
    """Where the key at `path` (loss.label_smoothing, dataset.train.kind) came from; None when unknown."""
    composition = _composition()
    if composition is None:
        return None
    typed = _override_setting(path, composition.overrides)
    if typed is not None:
        return Origin(f"the command line ({typed})", COMMAND_LINE)
    group, _, rest = path.partition(".")
    choice = composition.choices.get(group)
    if choice and rest and _sets(composition, f"{group}/{choice}", rest):
        return Origin(f"{group}={choice} ({_shown(_file(composition, f'{group}/{choice}'))})", OPTION)
    for preset, option in composition.choices.items():  # a preset of the global package sets keys of any group
        name = f"{preset}/{option}"
        if option and not preset.startswith("hydra") and _global(composition, name) and _sets(composition, name, path):
            return Origin(f"{preset}={option} ({_shown(_file(composition, name))})", PRESET)
    return None


def custom_entry_overrides(group: str) -> str | None:
    """The overrides that build `group` from its custom entry: `<group>=custom` and the user's own overrides of that
    group's keys, quoted for a shell; None when the group has no custom entry or the composition is unknown."""
    composition = _composition()
    if composition is None or _file(composition, f"{group}/{CUSTOM}") is None:
        return None
    own = [o.input_line for o in composition.overrides
           if str(o.key_or_group).startswith(f"{group}.") and not o.is_delete()]
    return " ".join(shlex.quote(line) for line in (f"{group}={CUSTOM}", *own))


def _override_setting(path: str, overrides) -> str | None:
    """The override that sets `path`: by its own key, or as a key of the mapping an override gives its parent."""
    for override in overrides:
        key = str(override.key_or_group)
        if override.is_delete() or not (path == key or path.startswith(f"{key}.")):
            continue
        if path == key or _has(override.value(), path[len(key) + 1:]):
            return override.input_line
    return None


def _file(composition: _Composition, name: str) -> Path | None:
    """The entry's YAML as Hydra finds it: the first config folder that has it."""
    return next((folder / f"{name}.yaml" for folder in composition.folders if (folder / f"{name}.yaml").is_file()),
                None)


def _sets(composition: _Composition, name: str, path: str) -> bool:
    found = _file(composition, name)
    return found is not None and _has(OmegaConf.to_container(OmegaConf.load(found), resolve=False), path)


def _global(composition: _Composition, name: str) -> bool:
    """Whether the entry's header puts it in the global package (`# @package _global_`, Hydra's header comment)."""
    found = _file(composition, name)
    if found is None:
        return False
    header = [line for line in found.read_text().splitlines() if line.startswith("#")]
    return any(m and m.group(1) == "_global_" for m in map(_PACKAGE.match, header))


def _shown(path: Path) -> str:
    """A file as the user would open it: relative to here when it is below, else absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative


def _has(tree, path: str) -> bool:
    """Whether a plain mapping holds the dotted key (nothing resolved: its interpolations point elsewhere)."""
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True
