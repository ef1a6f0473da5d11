"""Keys of a component's node that its class does not take, said in one line with where they came from and the
overrides that leave them out. The usual way in: an override of `_target_` (or of the whole node) is merged into
the chosen entry, so `loss._target_=torch.nn.NLLLoss` keeps cross_entropy's label_smoothing; the group's `custom`
entry (framework/config/custom_entry.py) has no keys to keep."""
from __future__ import annotations

import inspect

from framework.config.origins import COMMAND_LINE, OPTION, PRESET, Origin, custom_entry_overrides, origin_of

HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}  # instantiate's own, not arguments


def foreign_keys(node, parameters: dict[str, inspect.Parameter]) -> list[str]:
    """The node's keys the parameters do not name ([] when they take **kwargs, or are unknown: {})."""
    if not parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    taken = {name for name, p in parameters.items() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    return [str(k) for k in node if str(k) not in HYDRA_KEYS and str(k) not in taken]


def foreign_key_line(key: str, target: str, foreign: list[str], parameters: dict[str, inspect.Parameter]) -> str:
    """e.g. `loss key label_smoothing comes from loss=cross_entropy (conf/loss/cross_entropy.yaml), and
    torch.nn.NLLLoss does not take it (it takes: weight, ...); leave that entry's keys out: loss=custom
    loss._target_=torch.nn.NLLLoss`."""
    takes = ", ".join(n for n, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL) or "nothing"
    names = _listed(foreign)
    one = len(foreign) == 1
    origins = [origin_of(f"{key}.{name}") for name in foreign]
    origin = origins[0] if len(set(origins)) == 1 else None
    subject = f"{key} key{'' if one else 's'} {names}"
    refused = f"{target} does not take {'it' if one else 'them'} (it takes: {takes})"
    if origin is None:
        return f"{subject}: {refused}{_remedy(key, origins)}"
    return f"{subject} {'comes' if one else 'come'} from {origin.said}, and {refused}{_remedy(key, [origin])}"


def unused_entry_key_line(key: str, name: str) -> str | None:
    """For a key of `key` that no component uses: the line when the group's chosen entry brought it (its components
    were replaced, say), else None (a misspelt override of the user's is said as such by the caller)."""
    origin = origin_of(f"{key}.{name}")
    if origin is None or origin.kind != OPTION:
        return None
    return (f"{key} key {name} comes from {origin.said}, and none of the components named now uses it"
            f"{_remedy(key, [origin])}")


def dangling_interpolation_line(full_key: str, missing: str) -> str:
    """A key of an entry that interpolates one the config no longer has (`~dataset.download` took it out, and
    dataset.train.download is ${dataset.download}): the line, with where the interpolating key came from."""
    return f"{full_key} is ${{{missing}}}, and the config has no {missing}{entry_key_hint(full_key)}"


def entry_key_hint(path: str) -> str:
    """What to add to a refusal of the key at `path` when the group's chosen entry brought it (dataset.train beside
    the user's dataset._target_): where from, and the overrides that leave it out; '' otherwise."""
    origin = origin_of(path)
    if origin is None or origin.kind != OPTION:
        return ""
    return f"; {path} comes from {origin.said}{_remedy(path, [origin])}"


def _remedy(key: str, origins: list[Origin | None]) -> str:
    """The way out: the group's custom entry for keys its chosen entry brought; the override or the preset's file
    for keys the user put there."""
    kinds = {o.kind if o else None for o in origins}
    if kinds == {COMMAND_LINE}:
        return "; drop that override"
    if kinds == {PRESET}:
        return "; leave it out of that file"
    custom = custom_entry_overrides(key.split(".")[0])
    return f"; leave that entry's keys out: {custom}" if custom else ""


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
