"""What a typed setting allows, declared beside the field in its dataclass schema (framework/config/*.py).

    epochs: int = rule(3, at_least(1))

OmegaConf checks the type (and an Enum field's choices, framework/config/choices.py) when the config is composed or
merged; the rule checks the value when the schema is instantiated (`Checked.__post_init__`), and a cross-key rule
lives in the schema's own `check()`. Every failure names the field, its value and what is allowed;
framework/config/typed.py adds the config key in front.

A component checks its own constructor arguments with the same rules (`require`): those are plain Python values,
which nothing has typed, so there a rule checks the type too (a string or a bool is not an integer)."""
from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, Callable

from framework.common.errors import ConfigError


class SettingError(ValueError):
    """A field's value that its schema does not allow. `message`, when given, replaces the standard sentence
    (cross-key rules say which other field is involved); `{key}` in it stands for the schema's config key."""

    def __init__(self, field: str, value: Any, allowed: str = "", message: str = ""):
        super().__init__(message or f"{field}={value!r} is not allowed: expected {allowed}")
        self.field, self.value, self.allowed, self.message = field, value, allowed, message


class Rule:
    """`allowed` in words; `in_range(v)` the value part, asked of a value of the right type; `of_type(v)` the type part
    (None: any type), which OmegaConf already guarantees for a field of a typed schema."""

    def __init__(self, allowed: str, in_range: Callable[[Any], bool], of_type: Callable[[Any], bool] | None = None):
        self.allowed, self.in_range, self.of_type = allowed, in_range, of_type

    def ok(self, value: Any) -> bool:
        """Type and value, for a value nothing has typed."""
        return (self.of_type is None or self.of_type(value)) and self.in_range(value)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int_sequence(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_int(i) for i in v)


def at_least(low: int) -> Rule:
    return Rule(f"an integer >= {low}", lambda v: v >= low, _int)


def above(low: float) -> Rule:
    return Rule(f"a number > {low:g}", lambda v: v > low, _number)


def between(low: float, high: float, high_open: bool = False, low_open: bool = False) -> Rule:
    return Rule(f"a number in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}",
                lambda v: (low < v if low_open else low <= v) and (v < high if high_open else v <= high), _number)


def at_least_number(low: float) -> Rule:
    return Rule(f"a number >= {low:g}", lambda v: v >= low, _number)


def one_of(*choices, allowed: str = "") -> Rule:
    """A few values, of their own types (true is not 1). A choice of words is an Enum field instead (choices.py)."""
    return Rule(allowed or "one of " + ", ".join(str(c) for c in choices),
                lambda v: any(v == c and type(v) is type(c) for c in choices))


def compile_backend() -> Rule:
    """A backend torch.compile knows, its debugging ones included (torch.compiler.list_backends(exclude_tags=()))."""
    return Rule("a backend of torch.compiler.list_backends(exclude_tags=()): inductor, aot_eager, eager, cudagraphs, ...",
                lambda v: v == _DEFAULT_BACKEND or v in _compile_backends(), lambda v: isinstance(v, str))


# torch.compile's own default needs no lookup: listing the backends imports torch._dynamo (about 2 s here), which
# the driver's typing of the config would pay before the workers' template starts (framework/run.py: plan_run)
_DEFAULT_BACKEND = "inductor"


def _compile_backends() -> list[str]:
    import torch  # asked only when another backend is checked: torch.compiler's registry imports torch._dynamo

    return torch.compiler.list_backends(exclude_tags=())


def non_empty_text() -> Rule:
    return Rule("a non-empty string", lambda v: bool(v.strip()), lambda v: isinstance(v, str))


def int_list(low: int, unique: bool = False) -> Rule:
    return Rule(f"a non-empty list of {'distinct ' if unique else ''}integers >= {low}",
                lambda v: len(v) > 0 and all(i >= low for i in v) and (not unique or len(set(v)) == len(v)),
                _int_sequence)


def step_range() -> Rule:
    return Rule("[first, last]: two integers with 1 <= first <= last",
                lambda v: len(v) == 2 and 1 <= v[0] <= v[1], _int_sequence)


def require(key: str, value: Any, check: Rule) -> Any:
    """A component's own argument checked by the same rules as the schemas, type included (a component may be built
    outside any config, so it checks what it is given): ConfigError naming the key, the value and what is allowed."""
    if not check.ok(value):
        raise ConfigError(f"{key}={value!r} is not allowed: expected {check.allowed}")
    return value


def rule(default: Any, check: Rule, **kwargs) -> Any:
    """A dataclass field with a default and the Rule its value must pass (None passes where the type is Optional)."""
    return dataclasses.field(default=default, metadata={"rule": check}, **kwargs)


class Checked:
    """Base of every schema: instantiating it checks each field's rule, then the schema's cross-key `check()`.
    A field of a type OmegaConf enforces (the schema is instantiated from a config merged into it,
    framework/config/typed.py) has only its rule's value part checked; a field typed Any or a Union, the whole rule."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            check = f.metadata.get("rule")
            value = getattr(self, f.name)
            if check is None or (value is None and _optional(hints[f.name])):
                continue
            if not (check.in_range(value) if _enforced(hints[f.name]) else check.ok(value)):
                raise SettingError(f.name, value, allowed_text(type(self), f.name))
        self.check()

    def check(self) -> None:
        """Cross-key rules (raise SettingError naming the field at fault); none by default."""


def _optional(annotation) -> bool:
    return type(None) in typing.get_args(annotation)


_ENFORCED = (int, float, bool, str)


def _enforced(annotation) -> bool:
    """Whether OmegaConf gives a field of this type only values of it: a primitive, an Enum, a list of them
    (Optional or not); not Any, and not a Union of several types."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union:
        return len(args) == 1 and _enforced(args[0])
    if typing.get_origin(annotation) in (list, typing.List):
        return len(args) == 1 and _enforced(args[0])
    return annotation in _ENFORCED or (isinstance(annotation, type) and issubclass(annotation, enum.Enum))


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def allowed_text(schema: type, name: str) -> str:
    """What field `name` of `schema` allows, in words: its rule, else its type ('or null' when Optional)."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    if name not in fields:
        return "a key of " + schema.__name__
    annotation = typing.get_type_hints(schema)[name]
    check = fields[name].metadata.get("rule")
    text = check.allowed if check else _type_words(annotation)
    return text + (" or null" if _optional(annotation) else "")


def _type_words(annotation) -> str:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (list, typing.List) and args:
        return f"a list of {_type_words(args[0]).removeprefix('an ').removeprefix('a ')}s"
    if args and typing.get_origin(annotation) is typing.Union:
        return " or ".join(_type_words(a) for a in args)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in annotation)
    return _TYPE_WORDS.get(annotation, "a value of type " + getattr(annotation, "__name__", str(annotation)))
