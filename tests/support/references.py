"""The runs the engines' tests share (support/run_cache.py makes each once per session): LeNet on 1,024 Fashion-MNIST
images in global batches of 32, fp32, so that every engine's run can be compared step by step with one process doing
the same.

- ADAM: Adam without clipping, a loss point every step and a checkpoint every 4 steps (the newest 2 kept): the
  engines' equality with one process, their checkpoint layouts and resumes, their optimizer state per rank.
- RICH: every feature that composes with an engine, on at once (one rich run per engine, not one run per feature):
  16 steps of SGD with a clipping bound the gradient norm exceeds at every step (0.25; Adam would hide clipping: it
  is nearly blind to a gradient's scale), 2 micro-batches per step, two parameter groups (the first convolution
  frozen by lr_scale 0, no weight decay on the other biases), one of torch's lr schedulers by _target_ (StepLR;
  OneCycleLR and ReduceLROnPlateau where a test names them), an evaluation every 4 steps, activation checkpointing
  of the blocks and torch.compile
  (aot_eager: dynamo and AOTAutograd, which is what an engine's wrapper meets, without inductor's code generation;
  inductor in each engine family's workers: tests/engines/test_inductor.py),
  and the EMA of the weights where the engine allows it. Each rank's compiled and recomputed modules are recorded
  (support/user_code/speedup_probe.py).

One process with the same settings is every engine's reference: the same samples per step (each of W ranks takes
rank::W of the single process's batch), so what differs is the order of float sums (about 1e-7 relative)."""
from __future__ import annotations

STEPS = 12  # 32 steps an epoch: every run stays in epoch 1
LENET = [f"trainer.max_steps={STEPS}", "trainer.batch_size=32", "trainer.log_every_n_steps=1",
         "trainer.checkpoint_every_n_steps=4", "dataset.max_train_samples=1024", "dataset.max_test_samples=256"]
ADAM = [*LENET, "optimizer=adam", "trainer.grad_clip=null"]

RICH_STEPS = 16
LR = 0.2
CLIP = 0.25  # LeNet's gradient norm in these 16 steps: 0.33 and more
FROZEN = "features.0."  # the first convolution
GROUPS = ("optimizer.param_groups=[{name:frozen,params:[features.0.*],lr_scale:0},"
          "{name:no_decay,params:[*.bias],weight_decay:0.0}]")
GROUP_SCALES = {"default": 1.0, "frozen": 0.0, "no_decay": 1.0}  # the optimizer's groups, in order
SCHEDULERS = {
    "step": "{_target_:torch.optim.lr_scheduler.StepLR,step_size:8,gamma:0.5}",
    "one_cycle": "{_target_:torch.optim.lr_scheduler.OneCycleLR,max_lr:0.1}",  # per group: x lr_scale
    # threshold 0.9: only a 90% better accuracy counts, so the lr halves after every evaluation but the first
    "plateau": "{_target_:torch.optim.lr_scheduler.ReduceLROnPlateau,factor:0.5,patience:0,threshold:0.9}",
}
EVAL_EVERY = 4
SPEEDUPS = ["trainer.activation_checkpointing=true", "trainer.compile=true", "trainer.compile_backend=aot_eager",
            "+callbacks.probe._target_=speedup_probe.SpeedupProbe"]
EMA = ["callbacks=ema", "callbacks.ema.decay=0.8", "callbacks.ema.evaluate_with_ema=true"]
EMA_ENGINES = ("single", "dp", "ddp", "horovod")  # fsdp and deepspeed shard parameters: the EMA is refused there


def rich(scheduler: str = "step", ema: bool = True) -> list[str]:
    """The rich run's settings besides the engine's own (see the module's docstring)."""
    return [*LENET, f"trainer.max_steps={RICH_STEPS}", "optimizer=sgd", f"optimizer.lr={LR}",
            "optimizer.weight_decay=0.01", "trainer.grad_accum=2", f"trainer.grad_clip={CLIP}", GROUPS, "lr_schedule=torch", f"lr_schedule.scheduler={SCHEDULERS[scheduler]}",
            f"trainer.eval_every_n_steps={EVAL_EVERY}", *SPEEDUPS, *(EMA if ema else [])]


ENGINES = {
    "single": ["strategy=single"],
    "dp": ["strategy=dp"],
    "ddp": ["strategy=ddp", "strategy.nproc_per_node=2"],
    "fsdp": ["strategy=fsdp", "strategy.nproc_per_node=2"],
    "horovod": ["strategy=horovod", "strategy.np=2"],
    **{f"zero{stage}": ["strategy=deepspeed", "strategy.nproc_per_node=2", f"strategy.zero_stage={stage}"]
       for stage in range(4)},
}


def adam(engine: str) -> list[str]:
    return [*ENGINES[engine], *ADAM]


def rich_run(engine: str, scheduler: str = "step") -> list[str]:
    ema = engine in EMA_ENGINES
    return [*ENGINES[engine], *rich(scheduler, ema)]


def deepspeed_on_every_gpu(gpus: int, stage: int, precision: str) -> list[str]:
    """STEPS steps of 64 samples per GPU in 2 micro-batches, all in epoch 1 whatever the number of GPUs."""
    batch = 64 * gpus
    return ["strategy=deepspeed", f"strategy.zero_stage={stage}", f"trainer.precision={precision}",
            "trainer.grad_accum=2", "trainer.grad_clip=1.0", f"trainer.batch_size={batch}",
            f"dataset.max_train_samples={batch * STEPS}",
            *(a for a in ADAM if not a.startswith(("trainer.batch_size=", "dataset.max_train_samples=", "trainer.grad_clip=")))]
