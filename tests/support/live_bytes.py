"""The most bytes the tensors an operation made held at once, in this process (a CPU shows what a GPU would allocate):
each op's output counted once where it is new memory (not a view of an input or a tensor already counted), until
the tensor object that made it is freed."""
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._counted: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
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
