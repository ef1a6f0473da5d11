"""Tensor parallel: a plan names modules by pattern ('blocks.*.mlp.0', one '*' per name part, as parallelize_module
matches) and gives each a style, torch's DTensor ParallelStyles under short names. A model may carry its own plan
(`tensor_parallel_plan`, and `sequence_parallel_plan` for strategy.sequence_parallel; the built-in GPT does), the
user may give one in YAML (strategy.plan), or a function (strategy.parallelize: {_target_: ...}) that parallelizes
the model over the tp mesh itself (as Fabric's parallelize_fn). Everything a plan can get wrong is refused in the
driver, on the model built there: a style that does not exist, a pattern that matches no module, a style on a module
it cannot split, a dimension or head count that tp does not divide."""
from __future__ import annotations

from fnmatch import fnmatchcase

import torch
from hydra.utils import get_method
from torch import nn
from torch.func import functional_call
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

from framework.config.lookup import quiet_lookup
from framework.config.strategy_options import MeshOptions
from framework.common.errors import ConfigError, on_one_line
from framework.strategies.mesh.pipeline_cut import blocks, meta_batch, on_meta
from framework.telemetry.flops import silenced

# style name -> (what it does, the ParallelStyle for a module). Sequence styles keep the residual stream split along
# dim 1. A rowwise nn.Embedding takes token ids whole on every rank (tensor-parallel peers read the same batch):
# RowwiseParallel's default input layout, Shard(-1), is a Linear's (the colwise layer before it split its features),
# and would gather an embedding's ids from every rank into a sequence tp times as long.
STYLES = {
    "colwise": ("split the output features (nn.Linear, nn.Embedding)", lambda module: ColwiseParallel()),
    "rowwise": ("split the input features, all-reduce the output (nn.Linear, nn.Embedding)",
                lambda module: RowwiseParallel(input_layouts=_ids_whole(module))),
    "sequence": ("run on this rank's share of the sequence (a norm, dropout)", lambda module: SequenceParallel()),
    "colwise_from_sequence": ("colwise, gathering a sequence-split input first",
                              lambda module: ColwiseParallel(input_layouts=Shard(1))),
    "rowwise_to_sequence": ("rowwise, reduce-scattering the output along the sequence",
                            lambda module: RowwiseParallel(input_layouts=_ids_whole(module), output_layouts=Shard(1))),
    "gather_sequence": ("the module's input gathered from sequence shards",
                        lambda module: PrepareModuleInput(input_layouts=(Shard(1),),
                                                          desired_input_layouts=(Replicate(),), use_local_output=True)),
    "shard_sequence": ("the module's input split along the sequence",
                       lambda module: PrepareModuleInput(input_layouts=(Replicate(),),
                                                         desired_input_layouts=(Shard(1),), use_local_output=True)),
}
SPLITS_OUTPUT = ("colwise", "colwise_from_sequence")
SPLITS_INPUT = ("rowwise", "rowwise_to_sequence")
TAKES_SEQUENCE_SHARDS = ("sequence", "colwise_from_sequence", "gather_sequence")
MAKES_SEQUENCE_SHARDS = ("shard_sequence", "rowwise_to_sequence")


def _ids_whole(module: nn.Module):
    return Replicate() if isinstance(module, nn.Embedding) else None


def plan_of(model: nn.Module, options: MeshOptions) -> dict[str, str] | None:
    """The plan this run applies: strategy.plan, else the model's own (None with strategy.parallelize)."""
    if options.parallelize:
        return None
    if options.plan:
        if options.sequence_parallel:
            raise ConfigError("strategy.sequence_parallel=true is not allowed with strategy.plan: it picks the model's "
                              "own sequence_parallel_plan; write the sequence styles into strategy.plan instead")
        return dict(options.plan)
    attribute = "sequence_parallel_plan" if options.sequence_parallel else "tensor_parallel_plan"
    plan = getattr(model, attribute, None)
    if not plan:
        key = "strategy.sequence_parallel=true" if options.sequence_parallel else f"strategy.tp={options.tp}"
        raise ConfigError(f"{key} is not allowed for {type(model).__name__}: it has no {attribute}; give "
                          "strategy.plan (module-name pattern -> colwise, rowwise, ...: docs/model-parallel.md; on the "
                          "command line '+strategy.plan={pattern: style}') or strategy.parallelize "
                          "('+strategy.parallelize={_target_: your function (model, mesh)}')")
    return dict(plan)


def matches(pattern: str, name: str) -> bool:
    """parallelize_module's matching: part by part, '*' within one part."""
    parts, names = pattern.split("."), name.split(".")
    return len(parts) == len(names) and all(fnmatchcase(n, p) for p, n in zip(parts, names))


def resolve(model: nn.Module, plan: dict[str, str]) -> dict[str, str]:
    """Module name -> style, for every module a pattern matches (in the plan's order)."""
    names = [name for name, _ in model.named_modules() if name]
    resolved = {}
    for pattern, style in plan.items():
        for name in names:
            if matches(pattern, name):
                resolved[name] = style
    return resolved


def check_plan(model: nn.Module, options: MeshOptions) -> None:
    """ConfigError (one line: key, value, what is allowed) for a plan or function this model cannot take with tp."""
    tp = options.tp
    if options.parallelize:
        target = options.parallelize["_target_"]
        try:
            with quiet_lookup():
                function = get_method(str(target))
        except Exception as exc:  # hydra wraps the import error; its first line says what failed
            raise ConfigError(f"strategy.parallelize._target_={target} is not allowed: it cannot be imported "
                              f"({on_one_line(exc)}); is its package on PYTHONPATH?") from None
        if not callable(function):
            raise ConfigError(f"strategy.parallelize._target_={target} is not allowed: it is not a function "
                              "(model, mesh)")
        return
    plan = plan_of(model, options)
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ConfigError(f"strategy.plan.{pattern}={style!r} is not allowed: expected one of {', '.join(STYLES)}")
        if not resolve(model, {pattern: style}):
            sample = ", ".join(name for name, _ in list(model.named_modules())[1:9])
            raise ConfigError(f"strategy.plan: pattern {pattern!r} is not allowed for {type(model).__name__}: it "
                              f"matches no module (names such as {sample}; '*' stands for one part of a name)")
    resolved = resolve(model, plan)
    for name, style in resolved.items():
        _check_divisible(name, model.get_submodule(name), style, tp)
    _check_sequence_split_first(model, resolved, "strategy.plan" if options.plan else
                                f"strategy.sequence_parallel=true ({type(model).__name__}.sequence_parallel_plan)")
    declared = model.tp_divisible(options.sequence_parallel) if hasattr(model, "tp_divisible") else {}
    for key, count in declared.items():
        if count % tp:
            raise ConfigError(f"strategy.tp={tp} is not allowed with {key}={count}: tensor parallel gives each rank "
                              f"{key} / tp of them; use a tp that divides {count}")


def _check_sequence_split_first(model: nn.Module, resolved: dict[str, str], key: str) -> None:
    """A style that takes sequence shards (a norm's `sequence`, ...) needs a module before it that splits the
    sequence (`shard_sequence` on a block, or an embedding's output `rowwise_to_sequence`); else each rank's whole
    sequence is taken for its shard, and the loss meets tp times the tokens ("Expected input batch_size (512) to match
    target batch_size (256)", in a worker). Modules are taken in the order they are registered (their forward's
    order, for the models pipeline parallel cuts)."""
    for name, _ in model.named_modules():
        style = resolved.get(name)
        if style in MAKES_SEQUENCE_SHARDS:
            return
        if style in TAKES_SEQUENCE_SHARDS:
            first = next(iter(blocks(model)), "the first block")
            raise ConfigError(f"{key}: {name}={style} is not allowed here: it takes the sequence split over the tp "
                              f"ranks, and no module before it splits it; add shard_sequence on the first block "
                              f"({first}: shard_sequence), or split the embedding's output along the sequence "
                              f"(rowwise_to_sequence on it)")


def check_outputs_kept(model: nn.Module, options: MeshOptions, example) -> None:
    """A split module's output is a view of its DTensor's local shard, which autograd does not let the next module
    change in place: a plan on a model with nn.ReLU(inplace=True) after a split layer passed every check above and
    failed in a worker's first step ("Output 0 of _ToTorchTensor is a view and is being modified inplace"). The
    model's forward on meta tensors of `example` (a batch of one real input) shows it here: each split output's
    version counter moves when something changes it in place. A model that cannot run on meta tensors is not checked."""
    plan = plan_of(model, options)
    if plan is None:
        return
    split = {name: style for name, style in resolve(model, plan).items() if style in SPLITS_OUTPUT + SPLITS_INPUT}
    outputs = {}

    def keep(name):
        def hook(module, inputs, output):
            if torch.is_tensor(output):
                outputs[name] = (output, output._version)
        return hook

    hooks = [model.get_submodule(name).register_forward_hook(keep(name)) for name in split]
    try:
        with silenced(), torch.no_grad():
            functional_call(model, on_meta(model), (meta_batch(example),))
    except Exception:  # the model cannot run on meta tensors: the worker's first step decides
        return
    finally:
        for hook in hooks:
            hook.remove()
    for name, (output, version) in outputs.items():
        if output._version != version:
            key = "strategy.plan" if options.plan else f"{type(model).__name__}.tensor_parallel_plan"
            raise ConfigError(f"{key}: {name}={split[name]} is not allowed here: the module after {name} changes its "
                              "output in place (an inplace activation such as nn.ReLU(inplace=True)), and a split "
                              "output cannot be changed in place; make that module inplace=False, or leave "
                              f"{name} out of the plan")


def _check_divisible(name: str, module: nn.Module, style: str, tp: int) -> None:
    if style not in SPLITS_OUTPUT + SPLITS_INPUT:
        return
    if isinstance(module, nn.Linear):
        size, what = (module.out_features, "out_features") if style in SPLITS_OUTPUT else (module.in_features,
                                                                                              "in_features")
    elif isinstance(module, nn.Embedding):
        size, what = (module.embedding_dim, "embedding_dim") if style in SPLITS_OUTPUT else (module.num_embeddings,
                                                                                             "num_embeddings")
    else:
        raise ConfigError(f"strategy.plan: {name}={style} is not allowed: {name} is a {type(module).__name__}, and "
                          f"{style} splits nn.Linear or nn.Embedding; give it another style or leave it out")
    if size % tp:
        raise ConfigError(f"strategy.tp={tp} is not allowed with {name}={style}: its {what} ({size}) does not divide "
                          f"by {tp}; use a tp that divides {size}")


def apply_tensor_parallel(model: nn.Module, options: MeshOptions, tp_mesh: DeviceMesh) -> None:
    """The plan (or the user's function) applied in place: the matched modules' parameters become DTensors on the
    tp mesh. Modules of other pipeline stages (None here) are not matched."""
    if options.parallelize:
        node = dict(options.parallelize)
        function = get_method(str(node.pop("_target_")))
        function(model, tp_mesh, **node)
        return
    styles = {name: STYLES[style][1](model.get_submodule(name))
              for name, style in resolve(model, plan_of(model, options)).items()}
    parallelize_module(model, tp_mesh, styles)
