"""The trainer group's schema (conf/trainer/default.yaml): how long, how big, in what precision, how often to log,
evaluate and checkpoint. `python train.py --cfg job` prints the values a run gets."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import List, Optional, Union

from framework.config.choices import Accelerator, InvariantReduce, OnNonfinite, PrecisionChoice
from framework.config.rules import (Checked, SettingError, above, at_least, at_least_number, compile_backend, one_of, rule,
                                    step_range)


@dataclass(kw_only=True)
class TrainerConfig(Checked):
    epochs: int = rule(3, at_least(1))
    max_steps: Optional[int] = rule(None, at_least(1))  # stop after this many optimizer steps (null: all epochs)
    # GLOBAL batch per optimizer step, summed over every worker and accumulation step: each of W processes gets
    # batch_size / (W * grad_accum) samples per micro-batch
    batch_size: int = rule(128, at_least(1))
    grad_accum: int = rule(1, at_least(1))
    # one process reads its micro-batches as N data-parallel ranks would, in turn (rank 0's, rank 1's, ..., each
    # prepared as that rank prepares it): with grad_accum = N x k a step trains exactly the micro-batches of N ranks
    # accumulating k each (verify.py's rounding floor; framework/data/ranks_in_turn.py). null: its own order
    deal_as_ranks: Optional[int] = rule(None, at_least(1))
    precision: PrecisionChoice = PrecisionChoice.fp32  # fp32 | bf16 | fp16 (fp16 needs CUDA: GradScaler)
    # clip the global gradient norm to this value (null: no clipping); keeps the default lr 0.2 from diverging
    grad_clip: Optional[float] = rule(1.0, above(0))
    seed: int = rule(42, at_least(0))
    # the same bits run to run: torch's deterministic algorithms, cuDNN's flags, cuBLAS's workspace (true | warn:
    # an op without a deterministic kernel only warns | false); framework/training/determinism.py
    deterministic: Union[bool, str] = rule(False, one_of(False, True, "warn", allowed="false, true or warn"))
    log_every_n_steps: int = rule(100, at_least(1))
    progress_bar: bool = True  # rank 0 draws a live bar on a terminal (plain lines otherwise); false: plain lines
    log_all_ranks: bool = False  # other ranks' output on the console too, each line prefixed [rank N]
    eval_every_n_epochs: int = rule(1, at_least(1))
    # also evaluate every N optimizer steps (early stopping, the best checkpoint and TensorBoard on that clock; a
    # checkpoint is committed at each such step); the epoch-end evaluations of eval_every_n_epochs stay. null: epochs only
    eval_every_n_steps: Optional[int] = rule(None, at_least(1))
    num_workers: int = rule(0, at_least(0))  # DataLoader worker processes (only with dataset.in_memory=false)
    accelerator: Accelerator = Accelerator.auto  # auto | cpu | gpu (auto: the GPU when there is one)
    compile: bool = False  # torch.compile the model (the first steps and evaluation pay for compiling)
    # torch.compile's backend: inductor generates kernels; aot_eager runs what dynamo and AOTAutograd traced with eager
    # kernels (no code generation: a quick check that a model compiles under an engine)
    compile_backend: str = rule("inductor", compile_backend())
    # memory for compute: each of the model's blocks (the units fsdp shards) keeps only its input in forward and
    # runs again in backward (torch.utils.checkpoint); framework/training/speedups.py
    activation_checkpointing: bool = False
    # NHWC layout for image models and their batches: auto (where it pays: LeNet on the CPU) | true | false
    channels_last: Union[bool, str] = rule("auto", one_of("auto", True, False, allowed="auto, true or false"))
    checkpoint_every_n_steps: Optional[int] = rule(500, at_least(1))  # also at every epoch end; null: epoch ends only
    keep_checkpoints: int = rule(2, at_least(0))  # the newest N in <run folder>/checkpoints; 0: none written
    # write each checkpoint behind the loop: staged to CPU memory, then written while training goes on (at most one
    # in flight; file and DCP formats, not deepspeed): framework/training/async_save.py, docs/checkpoints.md
    async_checkpoint: bool = False
    # auto: the newest valid checkpoint of this run folder; none: start fresh; or a checkpoint .pt, a checkpoints
    # folder or a run folder
    resume: Optional[str] = "auto"
    # NaN/inf loss or gradient: stop (keeps the last good checkpoint) | skip (the step)
    on_nonfinite: OnNonfinite = OnNonfinite.stop
    # stop once this many optimizer steps in a row were skipped (on_nonfinite=skip, fp16's GradScaler): fp16's scaler
    # halves its scale at each skip, and 20 halvings take 65536 below 0.1, past where scaling can be the cause
    max_consecutive_skips: int = rule(20, at_least(1))
    # at a log boundary, name any rank whose busy time per step exceeds the median rank's by this factor
    straggler_threshold: float = rule(1.2, above(1))
    # ...only once it did so at this many log boundaries in a row, and by at least straggler_min_gap_ms per step
    straggler_intervals: int = rule(2, at_least(1))
    straggler_min_gap_ms: float = rule(10.0, at_least_number(0))
    # seconds without progress after which the run ends with every rank's stack, unless the ranks the others wait
    # for are computing (slow, not stalled: framework/telemetry/stall.py); null: no watchdog
    stall_timeout: Optional[float] = rule(300.0, above(0))
    # [first, last]: torch.profiler traces of these steps on every rank, in <run folder>/profile/ (null: none)
    profile: Optional[List[int]] = rule(None, step_range())
    objective: str = "acc"  # what a sweep optimizes: a metric's name (metrics group) or loss
    # the same run, bit for bit, on any number of workers (single, ddp): each global batch is micro_shards fixed
    # shards, their gradients summed exactly (invariant_reduce) with invariant_threads CPU threads per process;
    # micro_shards must be a multiple of every worker count the run may use (docs/invariant.md)
    invariant: bool = False
    micro_shards: int = rule(8, at_least(1))
    invariant_reduce: InvariantReduce = InvariantReduce.fixed_point
    invariant_threads: int = rule(1, at_least(1))
    # on GPUs, before launch: plan the run (plan.py) and refuse it in one line when rank 0's planned peak and the
    # GPU's device constants exceed its memory; CPU runs plan nothing; false: start without planning
    check_fit: bool = True

    @property
    def cuda_wanted(self) -> bool:
        import torch  # here: Hydra composes with these schemas before the driver imports torch (framework/cli.py)

        return self.accelerator == "gpu" or (self.accelerator == "auto" and torch.cuda.is_available())

    def engine(self) -> "EngineSettings":
        """What of the trainer's settings a strategy must agree with (its engine's own batch, accumulation,
        precision and clipping, a compile it may refuse, ...): the strategy gets only these."""
        shared = {f.name: getattr(self, f.name) for f in fields(EngineSettings) if f.name != "cuda"}
        return EngineSettings(**shared, cuda=self.cuda_wanted)

    def check(self) -> None:
        if self.resume is not None and not self.resume.strip():
            raise SettingError("resume", self.resume, "auto, none, or a path to a checkpoint or run folder")
        if self.async_checkpoint and self.keep_checkpoints == 0:
            raise SettingError("async_checkpoint", True, message="{key}.async_checkpoint=true is not allowed with "
                               "{key}.keep_checkpoints=0 (no checkpoint is written); allowed: false, or "
                               "keep_checkpoints >= 1")


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """The trainer settings a strategy sees (TrainerConfig.engine()); the names are trainer.*'s, for its messages."""

    precision: PrecisionChoice
    batch_size: int
    grad_accum: int
    grad_clip: Optional[float]
    compile: bool
    compile_backend: str
    activation_checkpointing: bool
    on_nonfinite: OnNonfinite
    stall_timeout: Optional[float]
    log_all_ranks: bool
    cuda: bool  # the run trains on GPUs (trainer.accelerator, and what this machine has)
