"""A callback for tests that logs a number of its own through the run's loggers (LoopState.log_scalar): the step's
square after every optimizer step, so a boundary writes its own step's (the last value logged before it)."""
from framework.callbacks.base import Callback


class StepSquared(Callback):
    def on_train_step_end(self, state, step: int) -> None:
        state.log_scalar("custom/step_squared", step * step)
