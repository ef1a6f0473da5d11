"""The most bytes the tensors an operation made held at once, in this process (a CPU shows what a GPU would allocate):
each torch call's output counted once where it is new memory (not a view of an input or a tensor already counted),
until the tensor object that made it is freed."""
import weakref

import torch
from torch.overrides import TorchFunctionMode


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


class LiveBytes(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._counted: set[int] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            ptr, size = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
            if ptr and ptr not in inputs and ptr not in self._counted:
                self._counted.add(ptr)
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._freed, ptr, size)
        return out

    def _freed(self, ptr: int, size: int) -> None:
        self._counted.discard(ptr)
        self.live -= size
