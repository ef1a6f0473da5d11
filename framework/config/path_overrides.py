"""Paths on the command line as a sweep names its job folders (`1_tp=2`, `3_lr=0.01_seed=2`). Hydra's override
grammar reads the value's own `=` as an error ("mismatched input '='"), so before Hydra parses the command line, a
path key's value that Hydra cannot parse as it is, and parses once quoted to the very same string, is quoted.
Anything Hydra parses already is left as it is, and so is a value with a comma: a sweep's list or a path's own comma
cannot be told apart, and Hydra's refusal then says how to quote it (quoting_hint)."""
from __future__ import annotations

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

# eval.py's and sample.py's run folder or weights file; train.py's checkpoint to resume
PATH_KEYS = ("ckpt_path", "trainer.resume")


def quoted_paths(argv: list[str]) -> list[str]:
    """The command line's arguments, with each path value that needs it quoted for Hydra."""
    return [_quoted(argument) for argument in argv]


def quoting_hint(override: str) -> str:
    """For a refused override of a path key whose value holds '=': how to quote it (else '')."""
    key, _, value = override.partition("=")
    if key.lstrip("+") not in PATH_KEYS or "=" not in value:
        return ""
    return (f"; quote each path that holds '=' for Hydra, e.g. '{key}=\"{value.split(',')[0]}\"' (a sweep: "
            f"'{key}=\"<path>\",\"<path>\"')")


def _quoted(argument: str) -> str:
    key, sep, value = argument.partition("=")
    if not sep or key.lstrip("+") not in PATH_KEYS or "," in value or _parses(argument):
        return argument
    for quote in ("'", '"'):
        candidate = f"{key}={quote}{value}{quote}"
        if quote not in value and _parses(candidate, value):
            return candidate
    return argument


def _parses(argument: str, to: str | None = None) -> bool:
    """Whether Hydra parses the override (to the value `to`, when given)."""
    try:
        [override] = OverridesParser.create().parse_overrides([argument])
    except OverrideParseException:
        return False
    return to is None or override.value() == to
