"""A probe callback for tests/test_compile_and_recompute.py: at fit start every rank writes which of the user's
modules run compiled in place (nn.Module.compile) and which recompute their forward in backward
(framework/training/speedups.py: recompute_in_backward), as the worker really built them."""
import json

from framework.callbacks.base import Callback


class SpeedupProbe(Callback):
    def on_fit_start(self, state) -> None:
        modules = list(state.model.named_modules())
        found = {
            "compiled": [n for n, m in modules if m._compiled_call_impl is not None],
            "recomputed": [n for n, m in modules if getattr(m.__dict__.get("forward"), "__name__", "") ==
                           "recomputed_forward"],
        }
        (state.run_dir / f"speedup_probe.rank{state.rank}.json").write_text(json.dumps(found))
