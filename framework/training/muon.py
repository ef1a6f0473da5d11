"""optimizer=muon: torch.optim.Muon on the param groups marked use_muon (the hidden 2-D matrices, by the rule of
framework/training/param_groups.py) and torch.optim.AdamW on the others (embeddings, the output layer, norms, biases,
conv kernels), stepped, scheduled, scaled and checkpointed as one torch optimizer.

torch's Muon takes 2-D parameters only and nothing else, so the recipe needs the two; both are torch's own classes,
holding the very group dicts and state of this one: an lr schedule, a GradScaler or a checkpoint that reads or
writes this optimizer's param_groups reaches both. A group's keys are its algorithm's (Muon: momentum, nesterov,
ns_coefficients, ns_steps, eps, adjust_lr_fn; AdamW: betas, eps, amsgrad, ...; both: lr, weight_decay)."""
from __future__ import annotations

import torch
from torch.optim import AdamW, Muon, Optimizer

MUON_ONLY = ("momentum", "nesterov", "ns_coefficients", "ns_steps", "adjust_lr_fn")
ADAMW_ONLY = ("betas", "amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
              "decoupled_weight_decay")


# Muon's own keywords, where this optimizer's defaults differ from torch.optim.Muon's or name them
MUON_DEFAULTS = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "adjust_lr_fn": "match_rms_adamw"}


class MuonWithAdamW(Optimizer):
    """params: param groups, each with `use_muon` (True: torch.optim.Muon, every parameter 2-D; False:
    torch.optim.AdamW). The keywords are both algorithms' defaults: lr and weight_decay shared (Muon's lr adjusted per
    matrix by adjust_lr_fn: match_rms_adamw makes AdamW's lr and weight decay fit Muon too), Muon's own, and AdamW's
    as adamw_betas and adamw_eps."""

    def __init__(self, params, *, lr: float = 1e-3, weight_decay: float = 0.1, adamw_betas=(0.9, 0.95),
                 adamw_eps: float = 1e-8, **muon_keywords):
        groups = list(params)
        if not groups or not all(isinstance(g, dict) and isinstance(g.get("use_muon"), bool) for g in groups):
            raise ValueError("MuonWithAdamW takes param groups that each say use_muon: true or false (optimizer=muon "
                             "makes them by its rule, framework/training/param_groups.py)")
        for index, group in enumerate(groups):
            foreign = [k for k in (ADAMW_ONLY if group["use_muon"] else MUON_ONLY) if k in group]
            if foreign:
                kind, other = ("Muon", "AdamW") if group["use_muon"] else ("AdamW", "Muon")
                raise ValueError(f"param group {group.get('name', index)} steps with {kind}, but sets {other}'s "
                                 f"{', '.join(foreign)}")
        muon_groups = [g for g in groups if g["use_muon"]]
        adamw_groups = [g for g in groups if not g["use_muon"]]
        # each adds its defaults to its own groups, which stay the dicts of `groups`
        self._muon = Muon(muon_groups, lr=lr, weight_decay=weight_decay, **{**MUON_DEFAULTS, **muon_keywords}
                          ) if muon_groups else None
        self._adamw = AdamW(adamw_groups, lr=lr, betas=tuple(adamw_betas), eps=adamw_eps,
                            weight_decay=weight_decay) if adamw_groups else None
        super().__init__(groups, {})
        # what a group may set (framework/training/param_groups.py checks the config's groups against it)
        self.defaults = {**(self._adamw.defaults if self._adamw else {}),
                         **(self._muon.defaults if self._muon else {}), "use_muon": False}
        self._share()

    def _share(self) -> None:
        """The inner optimizers hold this one's group dicts and state (after a load_state_dict replaced them)."""
        for inner, use_muon in ((self._muon, True), (self._adamw, False)):
            if inner is not None:
                inner.param_groups = [g for g in self.param_groups if g["use_muon"] == use_muon]
                inner.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for inner in (self._muon, self._adamw):
            if inner is not None:
                inner.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._share()
