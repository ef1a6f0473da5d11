"""What watches the training loop without being in it: a Callback answers a few hooks, and the loop calls every
callback's at the same points. Callbacks are components: the `callbacks` config group maps names to `_target_`
(conf/callbacks/default.yaml: console lines, TensorBoard), so a user adds one from their own package with
`+callbacks.mine._target_=mypkg.MyCallback` or a callbacks config of their own, without editing this repo.

Hooks, in the order a run meets them, and where they run (the loop calls each on every rank, so a hook may use
the collectives as long as it does so on every rank):

  on_fit_start(state)                     after a resume, before the first step
  on_train_step_start(state, step)        before the step's first micro-batch
  on_train_step_end(state, step)          after the optimizer step (or its skip)
  on_log(state, step, report)             at a log boundary, after the meters were gathered: report
                                          (framework/telemetry/per_gpu.py: IntervalReport) on rank 0, None elsewhere
  on_evaluation_start(state, step)        before an evaluation's first batch
  on_evaluation_end(state, step, result)  after an evaluation: result (EvalResult) on rank 0, None elsewhere
  on_checkpoint_saved(state, step, path)  after a checkpoint was committed (one written behind the loop: once the
                                          run learns it, at the next save, best keeping or the end)
  on_fit_end(state)                       after the last evaluation (not when the loop raised)
  on_exception(state, exc)                the loop raised exc (it goes on after the hooks ran)

`state` is the run's one LoopState (framework/training/loop_state.py), the whole of what a callback reads and calls:
the step and epoch, rank and world size, the collectives, the run folder, the model and optimizer, say(),
request_stop() and the few things the built-in callbacks need (docs/loop-features.md, "Writing a callback"). A
callback that cannot run with an engine says why in refuses(), which the driver asks before any worker starts."""
from __future__ import annotations

HOOKS = ("on_fit_start", "on_train_step_start", "on_train_step_end", "on_log", "on_evaluation_start",
         "on_evaluation_end", "on_checkpoint_saved", "on_fit_end", "on_exception")


class Callback:
    def on_fit_start(self, state) -> None:
        pass

    def on_train_step_start(self, state, step: int) -> None:
        pass

    def on_train_step_end(self, state, step: int) -> None:
        pass

    def on_log(self, state, step: int, report) -> None:
        pass

    def on_evaluation_start(self, state, step: int) -> None:
        pass

    def on_evaluation_end(self, state, step: int, result) -> None:
        pass

    def on_checkpoint_saved(self, state, step: int, path) -> None:
        pass

    def on_fit_end(self, state) -> None:
        pass

    def on_exception(self, state, exc: BaseException) -> None:
        pass

    def refuses(self, sharded: bool) -> str | None:
        """In the driver, before any worker starts: why this callback cannot run with the chosen engine (sharded:
        its checkpoints are shards, i.e. no rank holds whole parameters, as under fsdp and DeepSpeed); None: it can."""
        return None

    def close(self) -> None:
        """The worker is done with this callback (files to close); also after an exception."""

    def state_dict(self) -> dict | None:
        """What this callback must remember across a resume (saved in every checkpoint, under its name); None:
        nothing."""
        return None

    def load_state_dict(self, state: dict) -> None:
        """What state_dict() returned, from the checkpoint a run resumes."""


class Callbacks:
    """Every callback of the run by its name in the callbacks group, called in order."""

    def __init__(self, callbacks: dict[str, Callback]):
        self.named = dict(callbacks)
        self.items = list(self.named.values())

    def state_dict(self) -> dict:
        return {name: state for name, c in self.named.items() if (state := c.state_dict()) is not None}

    def load_state_dict(self, states: dict) -> None:
        for name, state in (states or {}).items():
            if name in self.named:
                self.named[name].load_state_dict(state)

    def __getattr__(self, hook: str):
        if hook not in HOOKS:
            raise AttributeError(hook)

        def call(*args):
            for callback in self.items:
                getattr(callback, hook)(*args)
        return call

    def close(self) -> None:
        for callback in self.items:
            callback.close()
