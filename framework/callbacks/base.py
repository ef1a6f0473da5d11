"""The base class of a callback, where users find it: `from framework.callbacks.base import Callback`. The hooks the
loop calls, and the container that calls them, are the loop's own interface (framework/training/callback.py)."""
from framework.training.callback import HOOKS, Callback, Callbacks

__all__ = ["HOOKS", "Callback", "Callbacks"]
