"""optimizer.param_groups: which of the model's parameters get other optimizer settings.

    optimizer:
      param_groups:
        - name: no_decay             # optional; the group's name in TensorBoard (lr/no_decay) and checkpoints
          params: ["*"]              # patterns over the model's parameter names (fnmatch: * and ?)
          ndim_below: 2              # optional: only parameters with fewer dimensions (nanoGPT's no-decay rule)
          weight_decay: 0.0          # any keyword of the optimizer, for these parameters
        - params: ["backbone.*"]
          lr_scale: 0.1              # lr x 0.1 (0 freezes them); the lr schedule applies to every group

A parameter goes to the first group that matches it; the rest form the default group (the optimizer's own
settings), which comes first in optimizer.param_groups. Names are the user's module's own (model.named_parameters()
before any wrapper: no `module.`, `_orig_mod.` or engine prefix): the plan is made on the plain model, and the
engine's parameters are named back by identity, or, where the engine replaced them in place (fully_shard's sharded
parameters), by position and shape, or by the names the engine gives (a pipeline stage's parameters under the whole
model's names). A pattern that matches no parameter, and a group left with none, are refused
in the driver before any worker starts.

optimizer=muon (framework/training/muon.py) adds its rule: each group is split into the part torch.optim.Muon steps
(`use_muon`: the hidden 2-D matrices, muon_rule below), named as the group, and the part AdamW steps, named
`<group>_adamw`; a group that sets use_muon itself (true or false) is taken whole by the one it names."""
from __future__ import annotations

import fnmatch
import math
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from framework.common.errors import ConfigError
from framework.config.optimizer import MuonConfig

KEY = "optimizer.param_groups"
DEFAULT = "default"
OWN_KEYS = ("name", "params", "ndim_below", "lr_scale")  # ours; every other key is the optimizer's
MUON = "use_muon"  # optimizer=muon: which of torch.optim.Muon and AdamW steps a group
ADAMW_SUFFIX = "_adamw"


@dataclass(frozen=True)
class GroupSpec:
    index: int
    name: str
    patterns: tuple[str, ...]
    ndim_below: int | None
    lr_scale: float
    settings: dict  # the optimizer's keywords for this group

    def takes(self, name: str, ndim: int) -> bool:
        return (self.ndim_below is None or ndim < self.ndim_below) and \
            any(fnmatch.fnmatchcase(name, p) for p in self.patterns)


def _spec(index: int, node) -> GroupSpec:
    key = f"{KEY}.{index}"
    if not isinstance(node, dict):
        raise ConfigError(f"{key}={node!r} is not allowed: expected a group, e.g. {{params: ['*.bias'], "
                          "weight_decay: 0.0}")
    patterns = node.get("params")
    if isinstance(patterns, str):
        patterns = [patterns]
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ConfigError(f"{key}.params={patterns!r} is not allowed: expected a non-empty list of parameter name "
                          "patterns, e.g. ['*.bias', 'backbone.*']")
    if "lr" in node:
        raise ConfigError(f"{key}.lr={node['lr']!r} is not allowed: give lr_scale, a multiple of optimizer.lr (so "
                          "optimizer.lr_scaling and the lr schedule apply to the group alike)")
    ndim = node.get("ndim_below")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 1):
        raise ConfigError(f"{key}.ndim_below={ndim!r} is not allowed: expected an integer >= 1 (2: parameters with "
                          "fewer than 2 dimensions, i.e. biases and norms' scales)")
    scale = node.get("lr_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale >= 0 and math.isfinite(scale)):
        raise ConfigError(f"{key}.lr_scale={scale!r} is not allowed: expected a number >= 0 (a multiple of "
                          "optimizer.lr; 0 freezes the group)")
    name = node.get("name", f"group{index}")
    if not isinstance(name, str) or not name or name == DEFAULT or "/" in name:
        raise ConfigError(f"{key}.name={name!r} is not allowed: expected a word other than {DEFAULT!r}, without '/'")
    settings = {k: v for k, v in node.items() if k not in OWN_KEYS}
    return GroupSpec(index, name, tuple(patterns), ndim, float(scale), settings)


class ParamGroups:
    """The plan: each of the plain model's parameters' group, by name (made once, on the model before any wrapper
    or speed-up; framework/assemble.py)."""

    def __init__(self, groups, model: nn.Module, muon: bool = False):
        self.specs = [_spec(i, node) for i, node in enumerate(groups or [])]
        names = [spec.name for spec in self.specs]
        for spec in self.specs:
            if names.count(spec.name) > 1:
                raise ConfigError(f"{KEY}.{spec.index}.name={spec.name!r} is not allowed: another group has that name")
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        # weak references: a parameter an engine replaces (fully_shard) may be freed, and its id() reused
        self._by_id = {id(p): (weakref.ref(p), i) for i, (_, p) in enumerate(named)}
        self.group_of = [self._first_match(n, len(s)) for n, s in zip(self.names, self.shapes)]
        self._check_every_pattern_matches(type(model).__name__)
        self.muon_of = self._muon_plan(muon_rule(model)) if muon else None

    @classmethod
    def of(cls, options, model: nn.Module) -> ParamGroups | None:
        """The plan for optimizer options (OptimizerConfig) on this model; None without param_groups (and without
        optimizer=muon, whose rule always splits)."""
        groups = getattr(options, "param_groups", None)
        muon = isinstance(options, MuonConfig)
        return cls(groups, model, muon) if groups or muon else None

    def _muon_plan(self, hidden: list[bool]) -> list[bool]:
        """Each parameter's use_muon: its group's where the group sets it, else the rule's."""
        adamw_parts = {DEFAULT + ADAMW_SUFFIX} | {s.name + ADAMW_SUFFIX for s in self.specs if MUON not in s.settings}
        for spec in self.specs:
            if spec.name in adamw_parts:
                raise ConfigError(f"{KEY}.{spec.index}.name={spec.name!r} is not allowed with optimizer=muon: it is "
                                  "the name of another group's AdamW part")
            given = spec.settings.get(MUON)
            if MUON in spec.settings and not isinstance(given, bool):
                raise ConfigError(f"{KEY}.{spec.index}.{MUON}={given!r} is not allowed: expected true "
                                  "(torch.optim.Muon) or false (AdamW)")
        plan = []
        for name, shape, group, rule in zip(self.names, self.shapes, self.group_of, hidden):
            spec = self.specs[group] if group is not None else None
            use = spec.settings[MUON] if spec is not None and MUON in spec.settings else rule
            if use and len(shape) != 2:
                raise ConfigError(f"{KEY}.{spec.index}.{MUON}=true is not allowed for {name} (shape {list(shape)}): "
                                  "torch.optim.Muon steps 2-D matrices only; narrow the group's params")
            plan.append(use)
        return plan

    def _first_match(self, name: str, ndim: int) -> int | None:
        return next((spec.index for spec in self.specs if spec.takes(name, ndim)), None)

    def _check_every_pattern_matches(self, model_name: str) -> None:
        shown = ", ".join(self.names[:8]) + (f", ... ({len(self.names)} in all)" if len(self.names) > 8 else "")
        for spec in self.specs:
            for pattern in spec.patterns:
                if not any(fnmatch.fnmatchcase(n, pattern) for n in self.names):
                    raise ConfigError(f"{KEY}.{spec.index}.params pattern {pattern!r} is not allowed: it matches no "
                                      f"parameter of {model_name} (its parameters: {shown})")
            if spec.index not in self.group_of:
                why = (f"none with fewer than {spec.ndim_below} dimensions" if spec.ndim_below is not None
                       else "each one they match is taken by an earlier group (the first match wins)")
                raise ConfigError(f"{KEY}.{spec.index} ({spec.name}) is not allowed: its patterns "
                                  f"{list(spec.patterns)} give it no parameter ({why})")

    def names_of(self, params: list) -> list[str]:
        """The model's names of the parameters an engine hands its optimizer: the same objects (single, ddp,
        DeepSpeed, compile, dp), else the same modules' parameters replaced in place, in order (fully_shard)."""
        found = [self._by_id.get(id(p)) for p in params]
        if all(f is not None and f[0]() is p for f, p in zip(found, params)):
            return [self.names[f[1]] for f in found]
        if len(params) == len(self.names) and all(tuple(p.shape) == s for p, s in zip(params, self.shapes)):
            return list(self.names)
        raise RuntimeError(f"{KEY}: the engine gave its optimizer {len(params)} parameters that are neither the "
                           f"model's own nor its {len(self.names)} parameters in order; the groups cannot be named")

    def given_names(self, names: list[str], params: list) -> list[str]:
        """The names an engine gave with its parameters (a pipeline stage's, under the whole model's names), each one
        of the model's own."""
        unknown = [n for n in names if n not in self.names]
        if len(names) != len(params) or unknown:
            raise RuntimeError(f"{KEY}: the engine named {len(names)} of its optimizer's {len(params)} parameters, "
                               f"{len(unknown)} of them by names the model does not have ({unknown[:3]}); the groups "
                               "cannot be named")
        return list(names)

    def split(self, params, lr: float, names: list[str] | None = None) -> list[dict]:
        """torch param groups for the engine's parameters: the default group first (when it has any), then each
        group in config order, with its settings, name and lr (optimizer.lr x lr_scale). `names`: the parameters'
        names in the model, where the engine gives them (a cut, parallelized model: neither the same objects nor all
        of them); else found by names_of."""
        params = list(params)
        index = {n: i for i, n in enumerate(self.names)}
        members: dict[int | None, list] = {None: [], **{spec.index: [] for spec in self.specs}}
        named = self.names_of(params) if names is None else self.given_names(names, params)
        muon: dict[int, bool] = {}
        for name, p in zip(named, params):
            members[self.group_of[index[name]]].append(p)
            if self.muon_of is not None:
                muon[id(p)] = self.muon_of[index[name]]
        groups = [{"params": members[None], "name": DEFAULT, "lr_scale": 1.0}]
        groups += [{"params": members[spec.index], **spec.settings, "name": spec.name, "lr_scale": spec.lr_scale,
                    "lr": lr * spec.lr_scale} for spec in self.specs]
        if self.muon_of is not None:
            groups = [part for group in groups for part in _muon_parts(group, muon)]
        return [g for g in groups if g["params"]]

    def check_settings(self, optimizer: torch.optim.Optimizer, target: str) -> None:
        """Each group's keys are the optimizer's own (its `defaults`), with values of their kind: a misspelt key
        would otherwise sit in the group unread."""
        known = optimizer.defaults
        for spec in self.specs:
            for key, value in spec.settings.items():
                if key not in known:
                    raise ConfigError(f"{KEY}.{spec.index}.{key} is not allowed: {target} has no setting {key!r} "
                                      f"(its settings: {', '.join(k for k in known if k != 'lr')}; and ours: "
                                      "name, params, ndim_below, lr_scale)")
                if not _same_kind(value, known[key]):
                    raise ConfigError(f"{KEY}.{spec.index}.{key}={value!r} is not allowed: {target}'s {key} is "
                                      f"{known[key]!r} by default; give a value of that kind")


def muon_rule(model: nn.Module) -> list[bool]:
    """optimizer=muon's rule, per model.named_parameters(): the hidden 2-D matrices, i.e. every 2-D parameter but an
    embedding's (nn.Embedding, and so a head tied to one) and the output layer's (the last nn.Linear the model
    registers). Embeddings, that head, norms, biases and conv kernels (not 2-D) go to AdamW."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    head = {id(p) for p in linears[-1].parameters()} if linears else set()
    return [p.ndim == 2 and id(p) not in embeddings and id(p) not in head for _, p in model.named_parameters()]


def _muon_parts(group: dict, muon: dict[int, bool]) -> list[dict]:
    """A group as Muon's part (its name) and AdamW's (`<name>_adamw`); one that sets use_muon stays whole."""
    if MUON in group:
        return [group]
    steps_muon = [p for p in group["params"] if muon[id(p)]]
    rest = [p for p in group["params"] if not muon[id(p)]]
    return [{**group, "params": steps_muon, MUON: True},
            {**group, "params": rest, MUON: False, "name": group["name"] + ADAMW_SUFFIX}]


def _same_kind(value, default) -> bool:
    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple)) and len(value) == len(default)
    return True


def group_lrs(optimizer) -> dict[str, float]:
    """Each param group's current lr by its name (the default group is `default`; groups without a name `group{i}`)."""
    return {str(g.get("name", f"group{i}")): float(g["lr"]) for i, g in enumerate(optimizer.param_groups)}


def group_settings(optimizer) -> list[dict]:
    """Each param group's settings but its parameters, as plain JSON values (a checkpoint's manifest records them)."""
    def plain(value):
        if isinstance(value, torch.Tensor):
            return value.item() if value.numel() == 1 else value.tolist()
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value if isinstance(value, (str, int, float, bool, type(None))) else str(value)

    return [{k: plain(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
