"""The base class of a callback and what its hooks get, where users find them:
`from framework.callbacks.base import Callback, LoopState`. The hooks the loop calls, and the container that calls
them, are the loop's own interface (framework/training/callback.py); the state is framework/training/loop_state.py."""
from framework.training.callback import HOOKS, Callback, Callbacks
from framework.training.loop_state import EvalResult, LoopState

__all__ = ["HOOKS", "Callback", "Callbacks", "EvalResult", "LoopState"]
