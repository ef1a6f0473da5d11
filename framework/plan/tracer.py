"""Live tensor bytes, counted op by op: a TorchDispatchMode that sees every storage an op creates, follows it until it
is freed (a weak reference to the storage) and keeps the peak of their sum, with what each storage holds at the peak.

What a storage holds is said by where it comes from, not guessed from sizes: the model's parameters and buffers, the
batch, gradients (a parameter's .grad once backward accumulated it), optimizer state (a tensor in the optimizer's
state after its step), activations (saved by autograd for backward: its pack hook sees them), a strategy's buffers
(labelled so by whoever made them) and temporaries (every other storage an op made). The same count works on real tensors and under FakeTensorMode (a fake tensor's storage
has its real size and no memory), which is what makes a plan without a GPU: framework/plan/rows.py."""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

PARAMETERS, BATCH, GRADIENTS, OPTIMIZER, ACTIVATIONS, TEMPORARIES, BUFFERS = (
    "parameters", "batch", "gradients", "optimizer", "activations", "temporaries", "buffers")
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER, ACTIVATIONS, TEMPORARIES, BUFFERS, BATCH)
# a later label wins over an earlier one only where it says more: an activation that is a parameter stays one, a
# gradient that lives in a strategy's buffer (ddp's buckets) stays a buffer
_RANK = {TEMPORARIES: 0, ACTIVATIONS: 1, BATCH: 2, GRADIENTS: 3, BUFFERS: 4, OPTIMIZER: 5, PARAMETERS: 6}


@dataclass
class _Storage:
    ref: weakref.ref
    nbytes: int
    category: str


class LiveBytes(TorchDispatchMode):
    """`with LiveBytes() as live: live.track(model, optimizer); ...steps...`; then live.peak (bytes) and
    live.at_peak() (bytes per category at that moment). reset_peak() starts a new peak from what is alive now (the
    second step of a run, with the first step's optimizer state alive)."""

    def __init__(self):
        super().__init__()
        self._storages: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._live: dict[int, _Storage] = {}
        self.current = 0
        self.peak = 0
        self._peak_members: list[tuple[_Storage, int]] = []  # with its bytes then: FSDP2 resizes storages later
        self._saved = None

    # what a storage holds
    def track(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        """The model's parameters, buffers and gradients, and the optimizer's state, as they are now; from now on,
        each gradient as backward accumulates it."""
        for tensor in model.parameters():
            self.label(tensor, PARAMETERS)
            self.label(tensor.grad, GRADIENTS)
            if tensor.requires_grad:
                tensor.register_post_accumulate_grad_hook(lambda p: self.label(p.grad, GRADIENTS))
        for tensor in model.buffers():
            self.label(tensor, PARAMETERS)
        if optimizer is not None:
            self.label_optimizer(optimizer)

    def label_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        for state in optimizer.state.values():
            for tensor in tree_leaves(state):
                self.label(tensor, OPTIMIZER)

    def label(self, tensor, category: str) -> None:
        for storage in _storages_of(tensor):
            known = self._storages.get(storage)
            if known is None:
                self._add(storage, category)
            elif _RANK[category] > _RANK[known.category]:
                known.category = category

    # the count
    def __enter__(self):
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._saved.__exit__(*exc)
        return super().__exit__(*exc)

    def _pack(self, tensor):
        self.label(tensor, ACTIVATIONS)
        return tensor

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._resized()  # since the last op: outside any op
        out = func(*args, **(kwargs or {}))
        self._resized()  # by this op (resize_)
        for storage in _storages_of(out):
            if storage not in self._storages:
                self._add(storage, TEMPORARIES)
        return out

    def _resized(self) -> None:
        """Storages resized in place (FSDP2 frees and refills its unsharded parameters so, outside any op): their
        bytes now, every live storage's, before and after every op."""
        for entry in self._live.values():
            storage = entry.ref()
            if storage is not None and entry.nbytes != storage.nbytes():
                self.current += storage.nbytes() - entry.nbytes
                entry.nbytes = storage.nbytes()
        self._at_most()

    def _add(self, storage, category: str) -> None:
        key = id(storage)
        entry = _Storage(weakref.ref(storage, lambda _ref, k=key: self._free(k)), storage.nbytes(), category)
        self._storages[storage] = entry
        self._live[key] = entry
        self.current += entry.nbytes
        self._at_most()

    def _free(self, key: int) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current -= entry.nbytes

    def _at_most(self) -> None:
        if self.current > self.peak:
            self._mark_peak()

    def reset_peak(self) -> None:
        self._mark_peak()

    def _mark_peak(self) -> None:
        self.peak = self.current
        self._peak_members = [(entry, entry.nbytes) for entry in self._live.values()]

    def at_peak(self) -> dict[str, int]:
        """Bytes per category at the peak, by what each storage was found to hold by the end (a gradient is made
        by an op before backward hands it over)."""
        bytes_of = dict.fromkeys(CATEGORIES, 0)
        for entry, nbytes in self._peak_members:
            bytes_of[entry.category] += nbytes
        return bytes_of

    def now(self) -> dict[str, int]:
        bytes_of = dict.fromkeys(CATEGORIES, 0)
        for entry in self._live.values():
            bytes_of[entry.category] += entry.nbytes
        return bytes_of


def _unpack(tensor):
    return tensor


def _storages_of(tree) -> list:
    """The storages of the tensors in a nesting; a wrapper subclass's (DTensor: the shard this rank holds) are its
    inner tensors'."""
    found = []
    for leaf in tree_leaves(tree):
        if not isinstance(leaf, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(leaf):
            names, _ = leaf.__tensor_flatten__()
            found.extend(_storages_of([getattr(leaf, name) for name in names]))
        elif leaf.layout == torch.strided and leaf.device.type != "meta":
            found.append(leaf.untyped_storage())
    return found
