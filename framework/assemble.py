"""The one assembly: a run's task (data, model, step, loss, metrics) built from its settings, and what the loop
trains built from the task and the strategy. The driver's dry run (framework/preflight.py), every worker
(framework/worker.py) and eval.py (framework/evaluate.py) build their task here, the same way. With the driver, the
only code that reads the whole config; each component is built from, and receives, its own part."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from framework.callbacks.base import Callback
from framework.callbacks.profiler import StepProfiler
from framework.checkpoints.state import signature
from framework.config.components import build_component
from framework.config.settings import Settings
from framework.data.augment import build_augment
from framework.data.build import Data, build_data
from framework.data.loaders import BatchPipeline, eval_batches
from framework.data.source import DataShare, Peers
from framework.data.text import vocabulary_of
from framework.common.errors import ConfigError
from framework.models.build import build_model
from framework.strategies.base import Strategy
from framework.training.engine import ProcessGroup, Wrapped
from framework.training.metrics import build_loss, build_metrics, check_metrics, class_ids_of
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups
from framework.training.speedups import apply_speedups, use_channels_last

EVAL_BATCH_PER_DEVICE = 1024


@dataclass
class Task:
    """What a run trains or evaluates: the data, the plain model (on the CPU, before any wrapper), the step, the loss
    and the metrics, the batched augmentation, and the memory layout the model and batches share on `device`."""

    data: Data
    model: nn.Module
    step: object
    loss: object
    metrics: dict
    augment: object
    channels_last: bool


def build_task(s: Settings, device: torch.device, channels_last_refusal: str | None, check: bool = False) -> Task:
    """Every component from its own options. check=True (the driver, once): the datasets' files, sample shapes and
    class ids are checked too (framework/data/build.py)."""
    loss = build_loss(s.loss)
    metrics = build_metrics(s.metrics)
    # class ids are checked where the loss or a metric takes them
    step = build_component(s.step, "step")
    needs_targets = s.step["_target_"] if getattr(step, "needs_targets", False) else None
    data = build_data(s.dataset, class_ids_of(loss, metrics), check=check, needs_targets=needs_targets)
    check_metrics(metrics, data.num_classes)
    model = build_model(s.model, data.in_shape, data.num_classes)
    augment = build_augment(s.dataset.augment, data.in_shape)
    # resolved once: the model's layout and the batches' layout must agree
    channels_last = use_channels_last(s.trainer.channels_last, model, device, data.in_shape,
                                      channels_last_refusal is None)
    return Task(data, model, step, loss, metrics, augment, channels_last)


def parallelize(s: Settings, strategy: Strategy, group: ProcessGroup, task: Task) -> Wrapped:
    """The task's model with its speed-ups, on the device and in the engine's wrapper, with its optimizer (its
    param groups planned on the plain model, by the user's parameter names)."""
    groups = ParamGroups.of(s.optimizer, task.model)
    t, modules = s.trainer, strategy.speedup_modules(task.model)
    model = apply_speedups(task.model, task.channels_last, group.device, move=not strategy.moves_model_itself,
                           checkpointed=modules.recomputed if t.activation_checkpointing else (),
                           compiled=modules.compiled if t.compile else (), backend=t.compile_backend)
    workers = group.dp_size * len(group.devices)  # data-parallel processes x the GPUs each drives (dp's replicas)
    return strategy.parallelize(
        model, lambda params, names=None: build_optimizer(s.optimizer, params, workers, groups, names), group)


def data_share(group: ProcessGroup, micro_batch: int, grad_accum: int = 1, num_workers: int = 0) -> DataShare:
    """This rank's place in the data: its data-parallel rank (model-parallel peers share one), the samples it takes
    at a time and its peers' collectives."""
    return DataShare(group.dp_rank, group.dp_size, group.device, micro_batch, grad_accum, num_workers,
                     Peers(group.dp_all_reduce_sum, group.gather_objects))


def test_batches(task: Task, group: ProcessGroup, num_workers: int):
    """A function giving this rank's share of the test split, in batches on its device (never augmented)."""
    pipeline = BatchPipeline(task.data.normalization, task.data.in_shape, group.device, task.channels_last)
    share = data_share(group, EVAL_BATCH_PER_DEVICE, num_workers=num_workers)
    return lambda: eval_batches(task.data.test, share, pipeline, task.data.collate["test"], task.data.pairs,
                                task.data.example)


def example_input(data: Data) -> object:
    """The first training sample's input as the model gets it (normalized where the dataset says how): what FLOPs
    are counted on."""
    return BatchPipeline(data.normalization, data.in_shape, torch.device("cpu"))(data.inputs(data.example))


def build_callbacks(nodes: dict, profile: list[int] | None = None) -> dict[str, Callback]:
    """The callbacks group's components by name, in order; trainer.profile adds the step profiler first."""
    callbacks: dict[str, Callback] = {"profiler": StepProfiler(*profile)} if profile else {}
    for name, node in (nodes or {}).items():
        callback = build_component(node, f"callbacks.{name}")
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks.{name}._target_={node['_target_']} is not allowed: it built a "
                              f"{type(callback).__name__}, not a framework.callbacks.base.Callback")
        callbacks[str(name)] = callback
    return callbacks


def model_record(model_config: dict, data: Data) -> dict:
    """What rebuilds the model outside a run (framework/results/trained_model.py), and the vocabulary its token ids
    stand for where the dataset has one (sample.py)."""
    return {"model_config": model_config, "in_shape": data.in_shape, "num_classes": data.num_classes,
            "vocab": vocabulary_of(data.train)}


def run_signature(s: Settings, data: Data) -> dict:
    """What a checkpoint of this run must match to be resumed by another (framework/checkpoints/state.py)."""
    scheduler = s.lr_schedule.scheduler if s.lr_schedule.name == "torch" else None
    return signature(s.model, s.dataset.display_name, s.optimizer._target_, data.in_shape, data.num_classes,
                     param_groups=s.optimizer.param_groups, lr_scheduler=scheduler)


def hparams_of(s: Settings, strategy_name: str) -> dict:
    t = s.trainer
    return {
        "strategy": strategy_name, "model": s.model_name, "dataset": s.dataset.display_name,
        "optimizer": s.optimizer._target_.rsplit(".", 1)[-1], "lr": float(s.optimizer.lr),
        "global_batch": t.batch_size, "grad_accum": t.grad_accum, "precision": t.precision, "seed": t.seed,
    }
