"""The mesh engine's parallelize() on gloo ranks (a persistent world, support/gloo_world.py), for what a step there
must not do on a GPU: tensor parallel alone leaves the parameters its plan does not split plain beside DTensors, and
the optimizer's foreach kernels (CUDA's default, never the CPU's) refuse the mix; the pipeline's last stage must not
keep its micro-batches' outputs (an LM's logits) after the step. tests/engines/test_model_parallel.py trains."""
import gc
import weakref

import torch

CPU = torch.device("cpu")
MIXED = "mixed torch.Tensor and DTensor"


def _gpt():
    from framework.models.gpt import GPT

    torch.manual_seed(0)
    return GPT((8,), 11, n_layer=2, n_head=2, n_embd=8)


def _on_mesh(strategy, rank: int, world: int):
    from framework.strategies.mesh.dims import MeshGroup

    return MeshGroup(rank, rank, world, CPU).on_mesh(strategy.dims)


def _one_step(wrapped) -> None:
    tokens = torch.randint(0, 11, (4, 8), generator=torch.Generator().manual_seed(1))
    wrapped.model(tokens).float().pow(2).mean().backward()
    wrapped.optimizer.step()


def _torch_refuses_a_foreach_step_on_plain_and_dtensor_parameters(rank: int, world: int) -> str:
    """The plan's DTensors beside the plain embeddings, norms and head, in one Adam group with foreach forced."""
    from framework.strategies.mesh.tensor_parallel import apply_tensor_parallel
    from support.driver import strategy_for

    strategy = strategy_for("strategy=tp", "trainer.accelerator=cpu")
    model = _gpt()
    apply_tensor_parallel(model, strategy.options, _on_mesh(strategy, rank, world).axis("tp"))

    class Wrapped:
        pass

    wrapped = Wrapped()
    wrapped.model, wrapped.optimizer = model, torch.optim.Adam(model.parameters(), lr=0.1, foreach=True)
    try:
        _one_step(wrapped)
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_torch_still_refuses_foreach_kernels_over_plain_tensors_and_dtensors(world2):
    """The reason for the engine's foreach=False on such groups (framework/strategies/mesh/foreach.py): if
    this starts passing, torch takes the mix, and the engine could leave torch's choice alone."""
    for message in world2.run(_torch_refuses_a_foreach_step_on_plain_and_dtensor_parameters):
        assert MIXED in message, message


def _tensor_parallel_step_as_cuda_would_run_it(rank: int, world: int, foreach) -> tuple[list, str]:
    """parallelize() with tp=2 and no FSDP2, its optimizer Adam(foreach=`foreach`); then what torch does on CUDA
    where a group's foreach is unset (None): it picks foreach kernels, since both kinds are on a CUDA device."""
    from framework.common.errors import ConfigError
    from support.driver import strategy_for

    strategy = strategy_for("strategy=tp", "trainer.accelerator=cpu")
    try:
        wrapped = strategy.parallelize(_gpt(), lambda params, names=None: torch.optim.Adam(params, lr=0.1,
                                                                                          foreach=foreach),
                                       _on_mesh(strategy, rank, world))
    except ConfigError as exc:
        return [], str(exc)
    groups = wrapped.optimizer.param_groups
    chosen = [g["foreach"] for g in groups]
    for g in groups:
        if g["foreach"] is None:  # torch.optim.optimizer._default_to_fused_or_foreach on CUDA tensors: True
            g["foreach"] = True
    _one_step(wrapped)
    return chosen, ""


def test_tensor_parallel_alone_steps_its_mixed_groups_without_foreach_kernels(world2):
    """The first optimizer step of strategy=tp on GPUs failed with DTensor's refusal: every group that mixes plain
    parameters and DTensors now runs torch's per-tensor loop, whatever the device would pick."""
    for chosen, refusal in world2.run(_tensor_parallel_step_as_cuda_would_run_it, None):
        assert refusal == "" and chosen == [False]
    # the config asked for foreach kernels itself: refused in one line, not turned off behind its back
    for chosen, refusal in world2.run(_tensor_parallel_step_as_cuda_would_run_it, True):
        assert refusal.startswith("optimizer.foreach=true is not allowed with this mesh: param group 0 holds both "
                                  "plain parameters and tensor-parallel DTensors"), refusal


def _pipeline_step_keeps(rank: int, world: int) -> list[int]:
    """One training step of pp=2 (1F1B, 4 microbatches): how many of the last stage's micro-batch outputs are still
    alive after it (weak references taken where the step reads them)."""
    from framework.strategies.mesh.pipeline_run import StandIn
    from framework.training.engine import Weighting
    from framework.training.losses import SequenceCrossEntropy
    from framework.training.step import Supervised
    from support.driver import strategy_for

    strategy = strategy_for("strategy=pp", "trainer.accelerator=cpu", "trainer.batch_size=4")
    wrapped = strategy.parallelize(_gpt(), lambda params, names=None: torch.optim.SGD(params, lr=0.1),
                                   _on_mesh(strategy, rank, world))
    seen = []

    def step(model, batch, loss):
        assert isinstance(model, StandIn)
        out = Supervised()(model, batch, loss)
        seen.append(weakref.ref(model.output))
        return out

    tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(1))
    batch = (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
    out = wrapped.forward_backward(step, batch, SequenceCrossEntropy(), Weighting(k=1))
    wrapped.optimizer.step()
    assert out.loss.shape == (4,)
    gc.collect()
    return [len(seen), sum(ref() is not None for ref in seen)]


def test_the_pipelines_last_stage_keeps_no_output_after_a_step(world2):
    """schedule.step keeps every micro-batch's output on the last stage (and returns a concatenated copy) unless
    return_outputs=False: for an LM, its logits twice, through the optimizer step and evaluation."""
    first, last = world2.run(_pipeline_step_keeps)
    assert first == [0, 0], "the first stage computes no loss"
    seen, alive = last
    assert seen >= 4, "4 microbatches (2 x pp), and torch's shape inference once on meta tensors"
    assert alive == 0, f"{alive} of the last stage's {seen} micro-batch outputs outlived the step"



def _embedding_split_by_rows(rank: int, world: int) -> bool:
    """A GPT's token embedding split `rowwise` over tp=2: whether its output is the whole embedding's."""
    from framework.strategies.mesh.tensor_parallel import apply_tensor_parallel
    from support.driver import strategy_for

    strategy = strategy_for("strategy=tp", "trainer.accelerator=cpu", "+strategy.plan={wte:rowwise}")
    model = _gpt()
    tokens = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    expected = model.wte(tokens).detach()
    apply_tensor_parallel(model, strategy.options, _on_mesh(strategy, rank, world).axis("tp"))
    got = model.wte(tokens)  # all-reduced: each rank the whole lookup
    return tuple(got.shape) == tuple(expected.shape) and torch.allclose(got, expected)


def test_an_embedding_split_by_rows_looks_up_the_same_token_ids_on_every_rank(world2):
    """`rowwise` on an nn.Embedding (each rank a share of the vocabulary) took RowwiseParallel's default input layout,
    a Linear's Shard(-1): the token ids, whole on every tensor-parallel rank, were gathered into rows twice as long
    ([3, 16] for [3, 8]). An embedding's ids are now taken as they are (Replicate)."""
    assert world2.run(_embedding_split_by_rows) == [True, True]


def _pipeline_clock_per_step(rank: int, world: int) -> list[dict]:
    """Two training steps of pp=2 x dp_shard=2 (FSDP2 stages): each step's spans other than compute, as the clock
    counted them."""
    from framework.training.engine import Weighting
    from framework.training.losses import SequenceCrossEntropy
    from framework.training.step import Supervised
    from support.driver import strategy_for

    strategy = strategy_for("strategy=pp", "strategy.dp_shard=2", "trainer.accelerator=cpu", "trainer.batch_size=8")
    group = _on_mesh(strategy, rank, world)
    wrapped = strategy.parallelize(_gpt(), lambda params, names=None: torch.optim.SGD(params, lr=0.1), group)
    clock = wrapped.wait_clock()
    steps = []
    for step in range(2):
        tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(10 * step + group.dp_rank))
        wrapped.forward_backward(Supervised(), (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()),
                                 SequenceCrossEntropy(), Weighting(k=1))
        wrapped.optimizer.step()
        steps.append({kind: len(clock.spans[kind]) for kind in ("reduce", "inference")} |
                     {"comm_covers_them": clock.comm_seconds() >= sum(
                         b - a for kind in ("reduce", "inference") for a, b in clock.spans[kind]) - 1e-9})
        clock.reset()
    return steps


def test_the_pipeline_clock_does_not_count_fsdps_reduction_or_shape_inference_as_bubble(world4):
    """Inside the schedule's span, FSDP2's reduce-scatter after a stage's last backward and the first step's shape
    inference (meta forward and backward, shapes sent between stages) were neither compute nor messages counted: they
    went into the bubble (time/wait_ms). Each has its own span now, counted as communication."""
    for rank, (first, second) in enumerate(world4.run(_pipeline_clock_per_step)):
        assert first["reduce"] == second["reduce"] == 1, f"rank {rank}: one reduction per step of its stage"
        assert first["inference"] > 0 and second["inference"] == 0, f"rank {rank}: shapes inferred in step 1 only"
        assert first["comm_covers_them"] and second["comm_covers_them"]


def _moved_after_sharding(rank: int, world: int, overrides: tuple) -> list[bool]:
    """parallelize() of a GPT whose moves to a device (Module.to, through Module._apply: torch has no hook for it) are
    recorded: for each, whether tensor parallel and FSDP2 had already made its parameters DTensors."""
    from torch.distributed.tensor import DTensor

    from framework.models.gpt import GPT
    from support.driver import strategy_for

    moves = []

    class Recorded(GPT):
        def _apply(self, fn, recurse=True):
            moves.append(any(isinstance(p, DTensor) for p in self.parameters()))
            return super()._apply(fn, recurse)

    strategy = strategy_for("trainer.accelerator=cpu", *overrides)
    torch.manual_seed(0)
    strategy.parallelize(Recorded((8,), 11, n_layer=2, n_head=2, n_embd=8),
                         lambda params, names=None: torch.optim.SGD(params, lr=0.1), _on_mesh(strategy, rank, world))
    return moves


def test_the_mesh_shards_the_model_before_it_moves_what_is_left_to_the_device(world2):
    """model.to(device) came before tensor parallel and FSDP2: every GPU held the whole fp32 stage first, what fails
    for exactly the models that need sharding. Now tensor parallel and fully_shard move each piece as they split it
    (on a GPU; here the device is the CPU), and the model's own move comes after, with its parameters DTensors."""
    for overrides in (("strategy=tp",), ("strategy=tp", "strategy.tp=1", "strategy.dp_shard=2")):
        for moves in world2.run(_moved_after_sharding, overrides):
            assert moves and moves[0] is True, (overrides, moves)


def _tie_after_sharding_two_stages_of_one_rank(rank: int, world: int) -> list[bool]:
    """ZBVZeroBubble's rank 0 with a data-parallel axis: the GPT's first and last stage (of 4) as the views
    parallelize() makes of them, each sharded as its own FSDP2 root over dp_shard=2, as Sharded.wrap does.
    Whether the head is still the embedding's parameter, before and after."""
    from framework.models.blocks import auto_units, innermost_first
    from framework.strategies.mesh.fsdp import ShardPrecision, shard_with_fsdp2, without_tied
    from framework.strategies.mesh.dims import MeshGroup
    from framework.strategies.mesh.pipeline_cut import stage_pieces, view
    from framework.strategies.mesh.dims import MeshDims

    from framework.models.gpt import GPT

    torch.manual_seed(0)
    model = GPT((8,), 11, n_layer=4, n_head=2, n_embd=8)
    stages = stage_pieces(model, 4, None)
    first, last = view(model, set(stages[0])), view(model, set(stages[3]))
    tied = [first.wte.weight is last.head.weight]
    group = MeshGroup(rank, rank, world, CPU).on_mesh(MeshDims(dp_shard=world))
    for part in (first, last):
        shard_with_fsdp2(part, innermost_first(part, without_tied(part, auto_units(part))), group.dp_mesh(),
                         ShardPrecision.of("fp32"), reshard_after_forward=False)
    return tied + [first.wte.weight is last.head.weight]


def test_torch_still_unties_a_parameter_two_fsdp2_roots_of_one_rank_share(world2):
    """The reason the driver refuses ZBVZeroBubble with a data-parallel axis for a model whose first and last stages
    share a parameter (tied_on_one_rank, tests/unit/test_model_parallel_checks.py): fully_shard replaces a parameter
    only on the modules of its own call, so the two stage views end with two parameters. If this starts failing,
    torch keeps the tie, and the refusal could go."""
    for before, after in world2.run(_tie_after_sharding_two_stages_of_one_rank):
        assert before and not after


def _zero_bubble_gradients(rank: int, world: int, schedule: str, recompute: bool) -> dict:
    """One training step of pp=2 under a zero-bubble schedule (2 stages per rank), the GPT's blocks recomputed in
    backward or not, as the worker applies activation checkpointing before parallelize(): this rank's gradients."""
    from framework.models.gpt import GPT
    from framework.training.engine import Weighting
    from framework.training.losses import SequenceCrossEntropy
    from framework.training.speedups import apply_speedups
    from framework.training.step import Supervised
    from support.driver import strategy_for

    torch.manual_seed(0)
    model = GPT((8,), 11, n_layer=4, n_head=2, n_embd=8)
    strategy = strategy_for("strategy=pp", f"strategy.schedule={schedule}", "trainer.accelerator=cpu",
                            "trainer.batch_size=4")
    if recompute:
        apply_speedups(model, False, CPU, move=False, checkpointed=strategy.speedup_modules(model).recomputed)
    wrapped = strategy.parallelize(model, lambda params, names=None: torch.optim.SGD(params, lr=0.1),
                                   _on_mesh(strategy, rank, world))
    forwards = []  # each block's first layer starts again when the block is recomputed (checkpoint stops early)
    for block in model.blocks:
        if block is not None:
            block.ln_1.register_forward_pre_hook(lambda *_: forwards.append(1))
    tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(1))
    wrapped.forward_backward(Supervised(), (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()),
                             SequenceCrossEntropy(), Weighting(k=1))
    return len(forwards), {name: p.grad.clone() for name, p in wrapped.model.named_parameters() if p.grad is not None}


def test_zero_bubble_schedules_with_recomputed_blocks_give_the_gradients_of_the_plain_step(world2):
    """A zero-bubble schedule splits each backward into its input gradients and, later, its weight gradients, both
    through the recomputed blocks' saved tensors: activation checkpointing with them was neither refused nor run.
    It runs, and changes no gradient."""
    for schedule in ("ZBVZeroBubble", "InterleavedZeroBubble"):
        plain = world2.run(_zero_bubble_gradients, schedule, False)
        recomputed = world2.run(_zero_bubble_gradients, schedule, True)
        for rank, ((runs, a), (reruns, b)) in enumerate(zip(plain, recomputed)):
            assert reruns > runs > 0, (schedule, rank, "each block's forward ran again in backward")
            assert a and sorted(a) == sorted(b), (schedule, rank, "no _checkpoint_wrapped_module. in the names")
            for name, grad in a.items():
                torch.testing.assert_close(b[name], grad, rtol=1e-5, atol=1e-7, msg=f"{schedule} rank {rank}: {name}")
