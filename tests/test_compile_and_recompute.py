"""trainer.compile and trainer.activation_checkpointing with every engine. In this process: the blocks really run
their forward again in backward, with the same dropout masks and gradients; fsdp compiles each block, not the model;
the parameter names stay the user's. As real runs (2 gloo workers for ddp, fsdp, horovod and deepspeed; one process):
both together train a small GPT with falling loss, the workers' blocks are compiled and recomputed
(tests/user_code/speedup_probe.py), and weights files keep the model's own keys and load in eval.py."""
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from conftest import REPO, check_ok, driver_says, pin_accelerator, read_scalars, run_dirs, run_train, strategy_for
from framework.models.blocks import auto_units
from framework.models.gpt import GPT
from framework.training.speedups import apply_speedups

CPU = torch.device("cpu")
USER_CODE = REPO / "tests" / "user_code"
SMALL_GPT = ["experiment=char_lm", "model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.dropout=0.1",
             "dataset.block_size=32", "trainer.batch_size=32", "trainer.max_steps=6", "trainer.log_every_n_steps=2"]
BOTH = ["trainer.compile=true", "trainer.activation_checkpointing=true"]
PROBE = ["+callbacks.probe._target_=speedup_probe.SpeedupProbe"]


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
    assert modules.recomputed == modules.compiled == fsdp.shard_units(model)
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


def probed(tmp_path, args: list[str]) -> tuple[dict, list[dict], list[float]]:
    """A real run of the small GPT with the probe: its result, every rank's probe and its loss curve."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(USER_CODE), os.environ.get("PYTHONPATH")]))}
    check_ok(run_train([*SMALL_GPT, *args, *PROBE], tmp_path, timeout=400, env=env))
    [run_dir] = run_dirs(tmp_path)
    probes = [json.loads(p.read_text()) for p in sorted(run_dir.glob("speedup_probe.rank*.json"))]
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    return json.loads((run_dir / "result.json").read_text()) | {"run_dir": str(run_dir)}, probes, losses


def assert_users_keys_and_eval_loads(run_dir, tmp_path) -> None:
    weights = torch.load(f"{run_dir}/weights/last.pt", map_location="cpu", weights_only=True)["model"]
    assert list(weights) == list(GPT((32,), weights["wte.weight"].shape[0], n_layer=2, n_embd=32, n_head=2).state_dict())
    (tmp_path / "eval").mkdir()
    proc = subprocess.run([sys.executable, str(REPO / "eval.py"), *pin_accelerator(
        [f"ckpt_path={run_dir}/weights/last.pt", "strategy=single"])], cwd=tmp_path / "eval", capture_output=True,
        text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert "test loss" in check_ok(proc)


BLOCKS = [f"blocks.{i}" for i in range(2)]


@pytest.mark.parametrize("workers, compiled", [
    (["strategy=ddp", "strategy.nproc_per_node=2"], [""]),
    (["strategy=fsdp", "strategy.nproc_per_node=2"], ["wpe", *BLOCKS, "ln_f"]),  # its units: each block compiled
    (["strategy=horovod", "strategy.np=2"], [""]),
], ids=["ddp", "fsdp", "horovod"])
def test_two_workers_train_compiled_and_recomputed_blocks(tmp_path, workers, compiled):
    result, probes, losses = probed(tmp_path, [*workers, *BOTH])
    assert len(probes) == 2 and all(p["compiled"] == compiled for p in probes), probes
    assert all(set(BLOCKS) <= set(p["recomputed"]) for p in probes), probes
    assert result["steps"] == 6 and losses[-1] < losses[0], losses
    assert_users_keys_and_eval_loads(result["run_dir"], tmp_path)


def test_deepspeed_compiles_through_its_engine_and_recomputes_blocks(tmp_path):
    result, probes, losses = probed(tmp_path, ["strategy=deepspeed", "strategy.nproc_per_node=2", *BOTH])
    assert len(probes) == 2 and all(p["compiled"] == [""] for p in probes), probes  # engine.compile(): the module
    assert all(set(BLOCKS) <= set(p["recomputed"]) for p in probes), probes
    assert result["steps"] == 6 and losses[-1] < losses[0], losses
    assert_users_keys_and_eval_loads(result["run_dir"], tmp_path)


@pytest.mark.parametrize("strategy", ["single", "dp"])  # dp on the CPU: one replica, the module itself
def test_one_process_trains_compiled_and_recomputed_blocks(tmp_path, strategy):
    result, [probe], losses = probed(tmp_path, [f"strategy={strategy}", *BOTH])
    assert probe["compiled"] == [""] and set(BLOCKS) <= set(probe["recomputed"])
    assert result["steps"] == 6 and losses[-1] < losses[0], losses
    assert_users_keys_and_eval_loads(result["run_dir"], tmp_path)


def test_dp_replicas_would_run_the_first_gpus_module():
    """Why strategy=dp refuses both on 2+ GPUs (framework/strategies/dp.py): nn.DataParallel's replicas are shallow
    copies of the module, so the recomputed forward and the compiled call they inherit run the original module."""
    model = small_gpt()
    block = model.blocks[0]
    apply_speedups(model, False, CPU, checkpointed=[block], compiled=[block])
    replica = block._replicate_for_data_parallel()
    assert replica.__dict__["forward"] is block.__dict__["forward"]
    assert replica._compiled_call_impl is block._compiled_call_impl


def test_fsdp_with_recomputed_units_matches_the_run_without_step_for_step(tmp_path):
    """Recomputing inside fully_shard's units (dropout 0.1) changes nothing the run computes: the same loss at every
    step as the same run without activation checkpointing."""
    fsdp = ["strategy=fsdp", "strategy.nproc_per_node=2"]
    _, probes, recomputed = probed(tmp_path / "recomputed", [*fsdp, "trainer.activation_checkpointing=true"])
    assert all(p == {"compiled": [], "recomputed": ["wpe", *BLOCKS, "ln_f"]} for p in probes), probes
    _, _, plain = probed(tmp_path / "plain", fsdp)
    assert recomputed == pytest.approx(plain, rel=1e-6) and len(plain) == 3
