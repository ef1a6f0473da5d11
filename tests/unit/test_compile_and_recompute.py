"""trainer.compile and trainer.activation_checkpointing, in this process: the blocks really run their forward again
in backward, with the same dropout masks and gradients; each strategy names its blocks and what it compiles; fsdp
compiles each block, not the model; the parameter names stay the user's; compile's backend is a setting. Under every
engine as real runs: tests/engines/test_rich_runs.py (each rank's compiled and recomputed modules, falling loss, the
user's keys in the weights, eval.py); fully_shard's units recomputed with dropout on two ranks:
tests/dist/test_fsdp_units.py."""
import torch
from torch import nn

from framework.models.blocks import auto_units
from framework.models.gpt import GPT
from framework.strategies.mesh.fsdp import shard_units
from framework.training.speedups import apply_speedups
from support.driver import driver_says, strategy_for

CPU = torch.device("cpu")


def small_gpt(dropout: float = 0.1) -> GPT:
    torch.manual_seed(0)
    return GPT((16,), 20, n_layer=2, n_head=2, n_embd=16, dropout=dropout)


def counted_step(model: GPT, tokens: torch.Tensor, count: bool = True, seed: int = 1):
    """One forward and backward (dropout drawn from `seed`): the loss, the gradients by name, and how often the first
    block's attention ran its forward (count=False: not counted; in a compiled block the counting hook would be a
    side effect that breaks the graph)."""
    calls = []
    hook = model.blocks[0].attn.register_forward_hook(lambda *_: calls.append(1) if count else None)
    torch.manual_seed(seed)
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.roll(-1, 1).flatten())
    loss.backward()
    hook.remove()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)


def test_checkpointed_blocks_run_again_in_backward_with_the_same_dropout():
    tokens = torch.randint(0, 20, (4, 16))
    plain, recomputed = small_gpt(), small_gpt()
    apply_speedups(recomputed, False, CPU, checkpointed=auto_units(recomputed))
    loss_a, grads_a, calls_a = counted_step(plain, tokens)
    loss_b, grads_b, calls_b = counted_step(recomputed, tokens)
    assert (calls_a, calls_b) == (1, 2), "the block's forward runs once more, in backward"
    torch.testing.assert_close(loss_b, loss_a)
    for name, grad in grads_a.items():  # the recomputation drew the same dropout masks (preserve_rng_state)
        torch.testing.assert_close(grads_b[name], grad, msg=name)
    assert list(recomputed.state_dict()) == list(plain.state_dict())


def test_each_strategy_names_its_blocks_and_what_it_compiles():
    model = small_gpt()
    for name in ("single", "ddp", "horovod"):
        modules = strategy_for(f"strategy={name}").speedup_modules(model)
        assert modules.recomputed == auto_units(model) and modules.compiled == [model], name
    fsdp = strategy_for("strategy=fsdp")
    modules = fsdp.speedup_modules(model)
    # fully_shard's units, each compiled and recomputed: the tied embedding and head are left to the root
    assert modules.recomputed == modules.compiled == shard_units(model, None)
    assert all(any(b is u for u in modules.recomputed) for b in model.blocks)
    assert not any(u is model.wte or u is model.head for u in modules.recomputed)
    deepspeed = strategy_for("strategy=deepspeed").speedup_modules(model)
    assert deepspeed.recomputed == auto_units(model) and deepspeed.compiled == []  # engine.compile() in parallelize


def test_fsdp_compiles_each_checkpointed_block_and_not_the_model():
    """The blocks fsdp compiles (its units) run as compiled graphs with their checkpoint inside, with the plain
    model's gradients (without dropout: compiled code draws its own masks); the root's own forward stays eager
    (fully_shard's hooks run between the blocks)."""
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters  # torch has no public count of the graphs it compiled
    tokens = torch.randint(0, 20, (4, 16))
    plain, fast = small_gpt(dropout=0.0), small_gpt(dropout=0.0)
    modules = strategy_for("strategy=fsdp").speedup_modules(fast)
    apply_speedups(fast, False, CPU, checkpointed=modules.recomputed, compiled=modules.compiled)
    root_compiling = []
    fast.register_forward_hook(lambda *_: root_compiling.append(torch.compiler.is_compiling()))
    loss_a, grads_a, _ = counted_step(plain, tokens)
    counters.clear()
    loss_b, grads_b, _ = counted_step(fast, tokens, count=False)
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters)
    assert root_compiling == [False]
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-4, atol=1e-5)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-3, atol=1e-5, msg=name)
    assert list(fast.state_dict()) == list(plain.state_dict()), "no _orig_mod. or _checkpoint_wrapped_module."


def test_a_model_without_blocks_is_refused_in_the_driver(tmp_path):
    line = driver_says(["model._target_=torch.nn.Identity", "trainer.activation_checkpointing=true"], tmp_path)
    assert line == ("trainer.activation_checkpointing=true is not allowed for Identity: it has no blocks to recompute "
                    "one at a time (submodules holding parameters); use trainer.activation_checkpointing=false")


def test_dp_replicas_would_run_the_first_gpus_module():
    """Why strategy=dp refuses both on 2+ GPUs (framework/strategies/dp.py): nn.DataParallel's replicas are shallow
    copies of the module, so the recomputed forward and the compiled call they inherit run the original module."""
    model = small_gpt()
    block = model.blocks[0]
    apply_speedups(model, False, CPU, checkpointed=[block], compiled=[block])
    replica = block._replicate_for_data_parallel()
    assert replica.__dict__["forward"] is block.__dict__["forward"]
    assert replica._compiled_call_impl is block._compiled_call_impl




def test_the_compile_backend_reaches_the_compiled_module():
    """trainer.compile_backend: `eager` runs dynamo's graph as is, `aot_eager` through AOTAutograd too (torch has no
    public count of either: its dynamo counters)."""
    counters = torch._dynamo.utils.counters
    for backend, through_aot_autograd in (("eager", False), ("aot_eager", True)):
        torch._dynamo.reset()
        counters.clear()
        model = small_gpt(dropout=0.0)
        apply_speedups(model, False, CPU, compiled=[model], backend=backend)
        model(torch.randint(0, 20, (2, 16)))
        assert counters["stats"]["unique_graphs"] == 1
        assert bool(counters["aot_autograd"]["total"]) == through_aot_autograd, backend


def test_a_compile_backend_torch_does_not_know_is_refused_in_one_line(tmp_path):
    line = driver_says(["trainer.compile=true", "trainer.compile_backend=nope"], tmp_path)
    assert line.startswith("trainer.compile_backend='nope' is not allowed: expected a backend of "
                           "torch.compiler.list_backends(exclude_tags=()): inductor, aot_eager"), line
