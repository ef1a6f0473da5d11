"""logger=wandb: the run in Weights & Biases (framework/results/wandb_tracking.py). Rank 0 logs one W&B run per
training run: the resolved config and the run folder as its config, every log interval's scalars (the TensorBoard
tags: framework/telemetry/scalars.py, per-rank throughput and loss included) and every evaluation by optimizer step,
the final metrics as its summary, and its end (failed when the loop raised). A sweep's jobs share the sweep's group.
With trainer.log_all_ranks=true every rank logs a run of its own, grouped by the training run (job_type rank<r>):
rank 0's holds everything, each other rank's its own per-rank tags and W&B's system metrics of its process. A
resumed run goes on in the same W&B run: its id is kept in the run folder (rank r > 0: `<id>-rank<r>`).

W&B's own settings apply (WANDB_MODE=offline, WANDB_API_KEY, ...); its files go to `dir`, else $WANDB_DIR, else the
run folder. The console stays ours (W&B does not capture it: train.log holds it)."""
from __future__ import annotations

from framework.callbacks.base import Callback
from framework.common.errors import ConfigError
from framework.results.result_file import read_resolved_config
from framework.results.wandb_tracking import files_dir, require_wandb, run_id, sweep_group, wandb_module
from framework.telemetry.scalars import eval_scalars, report_scalars

MODES = (None, "online", "offline", "disabled")


class WandbLog(Callback):
    def __init__(self, project: str = "hydra-dist", entity: str | None = None, group: str | None = None,
                 tags: list[str] | None = None, mode: str | None = None, dir: str | None = None):
        require_wandb()
        if mode not in MODES:
            raise ConfigError(f"callbacks.wandb.mode={mode!r} is not allowed: expected null (W&B's own: WANDB_MODE, "
                              "else online), online, offline or disabled")
        self.project, self.entity, self.group, self.tags, self.mode, self.dir = (
            project, entity, group, list(tags or []), mode, dir)
        self.run = None
        self.per_rank = self.started = False

    def on_fit_start(self, state) -> None:
        if self.run is not None:
            return
        self.per_rank = state.options.log_all_ranks
        if not (state.is_main or self.per_rank):
            return
        base = run_id(state.run_dir) if state.is_main else None
        if self.per_rank:  # every rank alike: the id rank 0 found in the run folder
            base = state.broadcast_object(base)
        self.run = self._start(state, base if state.is_main else f"{base}-rank{state.rank}")

    def _start(self, state, wandb_id: str):
        wandb = wandb_module()
        run_dir, sweep = state.run_dir, sweep_group(state.run_dir)
        name = run_dir.name if sweep is None else f"{sweep}/{run_dir.name}"
        group = self.group or (name if self.per_rank else sweep)
        config = {**read_resolved_config(run_dir), "hydra_dist": {"run_dir": str(run_dir), "sweep": sweep,
                                                                  "rank": state.rank}}
        self.started = True
        try:
            return wandb.init(
                project=self.project, entity=self.entity, id=wandb_id, resume="allow", group=group,
                job_type=f"rank{state.rank}" if self.per_rank else None,
                name=f"{name}/rank{state.rank}" if self.per_rank else name, tags=self.tags, config=config,
                mode=self.mode, dir=files_dir(self.dir, run_dir), settings=wandb.Settings(console="off", silent=True))
        except wandb.errors.UsageError as exc:  # no login for mode online, above all
            raise ConfigError(f"logger=wandb could not start its W&B run: {exc} (log in with `wandb login` or "
                              "WANDB_API_KEY, or log offline: WANDB_MODE=offline, then `wandb sync`)") from None

    def on_log(self, state, step: int, report) -> None:
        scalars = report_scalars(report, state.lrs()) if report is not None else None
        if self.per_rank:  # every rank alike; each other rank logs its own tags
            scalars = state.broadcast_object(scalars)
            if not state.is_main and scalars is not None:
                scalars = {k: v for k, v in scalars.items() if k.endswith(f"/rank{state.rank}")}
        if self.run is not None and scalars:
            self.run.log({k: v for k, v in scalars.items() if v == v}, step=step)  # NaN: not measured

    def on_evaluation_end(self, state, step: int, result) -> None:
        if result is not None and self.run is not None:
            self.run.log(eval_scalars(result.loss, result.metrics), step=step)

    def on_fit_end(self, state) -> None:
        if self.run is None:
            return
        if state.is_main:
            totals = state.totals
            self.run.summary.update({**totals.final_metrics(), "samples_per_sec": totals.samples_per_sec})
        self._finish(0)

    def on_exception(self, state, exc: BaseException) -> None:
        self._finish(130 if isinstance(exc, KeyboardInterrupt) else 1)

    def close(self) -> None:
        """After the worker's last hook: W&B's service process ends with the run, not with the interpreter (a
        finished worker leaves without its teardown)."""
        self._finish(1)
        if self.started:
            wandb_module().teardown()
            self.started = False

    def _finish(self, exit_code: int) -> None:
        if self.run is not None:
            self.run.finish(exit_code=exit_code)
            self.run = None
