"""Which `_target_`s a config may name: one allowlist that every component is built through (config/components.py,
the optimizer, the lr scheduler, the strategy class).

    built in        the framework's component packages, torch, torchvision, torchmetrics, the optional engines
    allowed_targets module patterns the current command allows (`allowed_targets=[mypkg.*]` on the command line or in
                    the user's own config): a dotted name, or a package prefix ending in `.*` (Hydra 1.4's syntax)
    composed        a training run trusts the config its user composed: each `_target_` in it, exactly

eval.py, sample.py and load_model read a run folder's config, which is data: they trust only the first two, plus
the exact targets of what their own command composed, so a run folder naming another package's callable is refused
before that package is imported. A name is checked as written (before any import) and, unless the allowlist names it
exactly, again as what it resolves to (`torch.os.system` is os.system, not torch's).

Not a sandbox: an allowed component still does what its arguments say (a dataset reads the files its config names;
CIFAR's batch files and sharded checkpoints' metadata are pickles), so evaluate only data you trust as well.

The allowlist in force is a context (`allowing(allowlist)`), set where a command starts (the driver's checks, each
worker, eval.py, sample.py, load_model); outside any, the built-in one. Hydra >= 1.4 gets the same list as its own
execution whitelist (its `_execution_whitelist_`), so its checks agree with ours."""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterator

import hydra.utils
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from framework.common.errors import ConfigError

KEY = "allowed_targets"
_HYDRA_UTILS_LOG = logging.getLogger("hydra.utils")
# where every built-in component lives (conf/: models, datasets, losses, metrics, steps, callbacks, strategies), and
# the libraries whose classes a config names directly
BUILT_IN = ("framework.models.*", "framework.data.*", "framework.training.*", "framework.callbacks.*",
            "framework.strategies.*", "torch.*", "torchvision.*", "torchmetrics.*", "deepspeed.*", "horovod.*")
# inside the packages above, what loads code from a path (a pickle, TorchScript, a C++ extension or custom op library,
# a hub repository), by name prefix, checked as written and as resolved
DENIED = ("torch.load", "torch.serialization.", "torch.hub.", "torch.jit.", "torch.package.",
          "torch.utils.cpp_extension.", "torch.ops.", "torch._ops.", "torch._C._jit", "torch._C.import_ir_module",
          "torch.classes.", "torch.library.")

# Hydra >= 1.4's execution whitelist (hydra.utils.execution_whitelist); None under 1.3, which has none
_HYDRA_WHITELIST = getattr(hydra.utils, "execution_whitelist", None)


def _matches(name: str, pattern: str) -> bool:
    return name.startswith(pattern[:-1]) if pattern.endswith(".*") else name == pattern


def valid_pattern(pattern: Any) -> bool:
    """A dotted name, or a package prefix with one trailing `.*` (what Hydra 1.4's whitelist takes)."""
    if not isinstance(pattern, str) or not pattern or any(c.isspace() for c in pattern):
        return False
    stem = pattern[:-2] if pattern.endswith(".*") else pattern
    return "*" not in stem and all(part.isidentifier() for part in stem.split("."))


def patterns_of(value: Any, key: str = KEY) -> tuple[str, ...]:
    """allowed_targets as given (a list of patterns, or null): ConfigError naming the key otherwise."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r} is not allowed: expected a list of module patterns, e.g. "
                          f"{key}=[mypkg.*] (a package prefix ending in .*, or a dotted name)")
    for index, pattern in enumerate(value):
        if not valid_pattern(pattern):
            raise ConfigError(f"{key}.{index}={pattern!r} is not allowed: expected a dotted name (mypkg.models.Net) "
                              "or a package prefix ending in .* (mypkg.*)")
    return tuple(value)


def targets_in(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """(key of the node, its `_target_`) for every node of a config tree (dicts and lists) that has one."""
    if isinstance(node, (dict, DictConfig)):
        if "_target_" in node:
            yield key, node.get("_target_")
        for name, child in node.items():
            if name != "_target_":
                yield from targets_in(child, f"{key}.{name}" if key else str(name))
    elif isinstance(node, (list, tuple, ListConfig)):
        for index, child in enumerate(node):
            yield from targets_in(child, f"{key}.{index}" if key else str(index))


@dataclass(frozen=True)
class TargetAllowlist:
    allowed: tuple[str, ...] = ()  # allowed_targets: the current command's patterns
    exact: frozenset[str] = frozenset()  # the targets of the config the current command composed, trusted as named

    @classmethod
    def of_command(cls, cfg: Any) -> TargetAllowlist:
        """What the config this command composed (a DictConfig or plain mapping; `hydra` is Hydra's) allows: its
        allowed_targets and, exactly, every `_target_` in it."""
        plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        plain.pop("hydra", None)
        allowed = patterns_of(plain.get(KEY))
        exact = {target for _, target in targets_in(plain) if isinstance(target, str)}
        return cls(allowed, frozenset(exact))

    def extended(self, patterns) -> TargetAllowlist:
        return TargetAllowlist(tuple(dict.fromkeys([*self.allowed, *patterns_of(patterns)])), self.exact)

    def allows(self, name: str) -> bool:
        if name in self.exact:
            return True
        if name.startswith(DENIED):
            return False
        return any(_matches(name, pattern) for pattern in (*BUILT_IN, *self.allowed))

    def refusal(self, key: str, target: Any) -> str | None:
        """Why `key._target_=target` may not be built (None: it may), judged by its name alone: nothing imported."""
        if not isinstance(target, str):  # a class or function given in Python, not named by a config
            return None
        if self.allows(target):
            return None
        return self._line(key, target, "")

    def resolved_refusal(self, key: str, target: Any) -> str | None:
        """After the name passed: why what it resolves to may not be built (an allowed name that is an alias of
        something else, e.g. torch.os.system). A name the allowlist gives exactly is trusted as named (as Hydra 1.4
        trusts an exact whitelist entry); one that does not import is left to the builder, which says so."""
        if not isinstance(target, str) or target in self.exact or target in self.allowed:
            return None
        try:
            resolved = locate(target)
        except Exception:
            return None
        identity = _identity(resolved)
        if identity is not None and self.allows(identity):
            return None
        return self._line(key, target, f" (it is {identity})")

    def _line(self, key: str, target: str, what: str) -> str:
        given = ", ".join(self.allowed) or "none"
        package = target.split(".", 1)[0]
        return (f"{key}._target_={target}{what} is not allowed: outside {KEY} (the framework's, torch's, "
                f"torchvision's, torchmetrics' and the engines' targets, plus {KEY}=[{given}]); if you trust it, "
                f"allow its package: {KEY}=[{package}.*]")

    def check(self, node: Any, key: str) -> None:
        """Every `_target_` in a config tree, by name first (nothing is imported before all names passed), then by
        what each resolves to. ConfigError naming the first one refused."""
        found = list(targets_in(node, key))
        for where, target in found:
            line = self.refusal(where, target)
            if line:
                raise ConfigError(line)
        for where, target in found:
            line = self.resolved_refusal(where, target)
            if line:
                raise ConfigError(line)

    def check_name(self, target: Any, key: str) -> None:
        """One `_target_` (a class path a component names) by name, then by what it resolves to."""
        self.check({"_target_": target}, key)

    def hydra_whitelist(self):
        """The same allowlist as Hydra's execution whitelist (Hydra >= 1.4; None under 1.3). Hydra has no denied
        names: those are ours alone, checked first."""
        if _HYDRA_WHITELIST is None:
            return None
        return _HYDRA_WHITELIST([*BUILT_IN, *self.allowed, *self._exact_as_resolved], reset=True)

    @functools.cached_property
    def _exact_as_resolved(self) -> list[str]:
        """The exact targets and what each resolves to, once per allowlist (every build asks): Hydra checks the
        resolved name, and a library's alias (transformers.BertModel is transformers.models.bert.modeling_bert.
        BertModel) is trusted as named."""
        return sorted({*self.exact, *filter(None, map(_resolved_identity, self.exact))})


def _resolved_identity(name: str) -> str | None:
    try:
        return _identity(locate(name))
    except Exception:  # one that does not import is left to the builder, which says so
        return None


def locate(name: str) -> Any:
    """What a dotted name names (hydra.utils.get_object), without the ERROR that Hydra logs for each name that does
    not import: the caller says so in its own one line, and Hydra's (three lines a lookup) printed above it."""
    was = _HYDRA_UTILS_LOG.disabled
    _HYDRA_UTILS_LOG.disabled = True
    try:
        return get_object(name)
    finally:
        _HYDRA_UTILS_LOG.disabled = was


def _identity(obj: Any) -> str | None:
    """module.qualname of a class or function (a C method by its owner's module); an object that is neither (a
    functools.partial, any callable instance) by its class's."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    return None if isinstance(obj, type) else _identity(type(obj))


_CURRENT: ContextVar[TargetAllowlist] = ContextVar("hydra_dist_allowed_targets", default=TargetAllowlist())


def current() -> TargetAllowlist:
    """The allowlist in force here: what the command that runs set with allowing(), else the built-in one."""
    return _CURRENT.get()


@contextlib.contextmanager
def allowing(allowlist: TargetAllowlist):
    token = _CURRENT.set(allowlist)
    try:
        yield allowlist
    finally:
        _CURRENT.reset(token)


def instantiate(node: Any, key: str, *args, **kwargs) -> Any:
    """hydra.utils.instantiate through the allowlist in force: every `_target_` in node checked first (ConfigError
    naming the first refused, before it is imported), then Hydra builds it, with the same list as its own execution
    whitelist where Hydra has one (>= 1.4)."""
    allowlist = current()
    allowlist.check(node, key)
    whitelist = allowlist.hydra_whitelist()
    if whitelist is not None:
        kwargs["_execution_whitelist_"] = whitelist
    return hydra.utils.instantiate(node, *args, **kwargs)
