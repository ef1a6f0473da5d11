"""The plan (framework/plan/), in this process: its parameter, optimizer and buffer terms against their closed
forms (AdamW: two fp32 moments and a step count per parameter tensor; fsdp: rank 0's padded shard, 1/N), LeNet's
planned peak against the peak torch.profiler measures on a real step, the largest micro-batch that fits, plan.png,
and its refusals in one line."""
import gzip
import json
import math
import sys

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from support.driver import composed

from framework.assemble import RunContext, build_task, parallelize, seed_everything
from framework.common.errors import ConfigError
from framework.config.settings import settings_of
from framework.config.targets import TargetAllowlist, allowing
from framework.plan.batch import first_batch
from framework.plan.command import composed_runs, plan_options
from framework.plan.gpus import chosen_gpu
from framework.plan.largest_batch import largest_micro_batch
from framework.plan.picture import write_png
from framework.plan.rows import Row, plan_row
from framework.plan.steps import counted_steps
from framework.plan.tracer import CATEGORIES, TEMPORARIES, LiveBytes
from framework.strategies import choose_strategy
from framework.training.engine import LocalGroup, Weighting, forward_backward

LENET = ("model=lenet", "dataset=fashion_mnist")
CHAR_LM = ("experiment=char_lm",)
MIB = 2 ** 20


def planned(*overrides):
    return plan_row(composed(*overrides, "trainer.accelerator=cpu"))


def shapes(*overrides) -> list[torch.Size]:
    """The model's parameter shapes, each tensor once (tied ones too), as the run builds it."""
    cfg = composed(*overrides, "trainer.accelerator=cpu")
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        task = build_task(settings_of(cfg, strategy_class.Options), torch.device("cpu"), "a unit test")
    return [p.shape for p in task.model.parameters()]


def adamw_bytes(shards: list[int], tensors: int) -> int:
    return 2 * 4 * sum(shards) + 4 * tensors  # exp_avg, exp_avg_sq (fp32) and a float32 `step` per tensor


@pytest.mark.parametrize("model", [LENET, CHAR_LM], ids=["lenet", "char_lm"])
def test_single_holds_the_parameters_and_adamw_holds_two_moments_of_each(model):
    row = planned(*model, "strategy=single", "optimizer=adamw")
    numels = [s.numel() for s in shapes(*model, "optimizer=adamw")]
    assert row.parameters == 4 * sum(numels)
    assert row.optimizer == adamw_bytes(numels, len(numels))


@pytest.mark.parametrize("workers", [2, 4])
def test_fsdp_keeps_rank_0s_shard_of_parameters_and_moments(workers):
    row = planned(*CHAR_LM, "strategy=fsdp", f"strategy.nproc_per_node={workers}")
    # fully_shard cuts dim 0 in `workers` chunks, padded to the largest: rank 0's
    shards = [math.ceil(s[0] / workers) * (s.numel() // s[0]) for s in shapes(*CHAR_LM)]
    assert row.parameters == 4 * sum(shards)
    assert row.optimizer == adamw_bytes(shards, len(shards))
    assert sum(getattr(row, c) for c in CATEGORIES) == row.peak  # gathered parameters freed by a resize included
    whole = planned(*CHAR_LM, "strategy=fsdp", "strategy.nproc_per_node=1")
    assert row.parameters == pytest.approx(whole.parameters / workers, rel=0.01)


def test_ddp_adds_its_gradient_buckets_once_and_keeps_no_gradient_beside_them():
    row = planned(*LENET, "strategy=ddp", "strategy.nproc_per_node=2")
    params = 4 * sum(s.numel() for s in shapes(*LENET))
    assert row.buffers == params and row.gradients == 0
    assert row.micro_batch == composed(*LENET).trainer.batch_size // 2


def test_lenets_planned_peak_is_within_10_percent_of_the_peak_measured_on_a_real_step(tmp_path):
    row = planned(*LENET, "strategy=single")
    measured = profiled_peak(tmp_path, *LENET)
    assert abs(row.peak - measured) <= 0.1 * measured, (row.peak, measured)


def test_the_count_on_fake_tensors_equals_the_count_on_real_ones_in_every_category(tmp_path):
    """What the plan adds to counting is fake tensors: they must not move a byte between categories (torch's
    FSDPMemTracker's do: optimizer state 68 MiB instead of 16 under FakeTensorMode, notes of issue 57's probe)."""
    row = planned(*CHAR_LM, "strategy=single")
    s, task, wrapped = built(tmp_path, *CHAR_LM)
    with LiveBytes() as live:
        counted_steps(wrapped, task.step, task.loss, first_batch(task.data, s.trainer.batch_size), s.trainer, live)
    assert live.peak == row.peak
    assert live.at_peak() == {c: getattr(row, c) for c in CATEGORIES}


def built(tmp_path, *overrides):
    """The run's settings, task and wrapped model on real tensors, one process, as a worker assembles them."""
    cfg = composed(*overrides, "trainer.accelerator=cpu")
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        s = settings_of(cfg, strategy_class.Options)
        seed_everything(s.trainer.seed)
        task = build_task(s, torch.device("cpu"), "measured as planned")
        strategy = strategy_class(s.strategy, s.trainer.engine(), ranks=None)
        ctx = RunContext(settings=s, strategy=strategy, group=LocalGroup(torch.device("cpu")), ranks=None,
                         run_dir=tmp_path, say=print, stop=None)
        return s, task, parallelize(ctx, task)


def profiled_peak(tmp_path, *overrides) -> int:
    """The most tensor bytes alive during a real second training step, by torch.profiler's memory timeline: the
    CPU allocator's own allocation and free events, joined to ops by the profiler. Independent of the plan, which
    counts storages in a dispatch mode on fake tensors and never runs under the profiler: only the assembly (the
    model, the optimizer, the batch) is shared, the thing both measure."""
    s, task, wrapped = built(tmp_path, *overrides)
    batch = first_batch(task.data, s.trainer.batch_size)

    def step():
        wrapped.optimizer.zero_grad(set_to_none=True)
        forward_backward(wrapped, task.step, batch, task.loss, Weighting(1))
        wrapped.precision.optimizer_step(wrapped.model, wrapped.optimizer, s.trainer.grad_clip, False)

    step()  # the optimizer's state exists from here on, as in the plan's second step
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as p:
        step()
    path = tmp_path / "memory.raw.json.gz"
    p.export_memory_timeline(str(path), device="cpu")
    alive = peak = 0
    for _, action, nbytes, _ in sorted(json.loads(gzip.decompress(path.read_bytes())), key=lambda e: e[0]):
        alive += -abs(nbytes) if action == 4 else nbytes  # (time, action, bytes, category); 4: destroyed
        peak = max(peak, alive)
    return peak


def test_an_unknown_gpu_is_refused_in_one_line_naming_the_cards():
    with pytest.raises(ConfigError) as refused:
        chosen_gpu("K80")
    line = str(refused.value)
    assert line.startswith("plan.gpu=K80 is not allowed") and "H100-80GB" in line and "\n" not in line
    assert chosen_gpu("h100-80gb").memory == 80 * 2 ** 30


def test_a_plan_key_it_does_not_have_is_refused_and_plan_keys_leave_the_runs_overrides():
    options, rest = plan_options(["plan.gpu=A100-80GB", "strategy=ddp"])
    assert options.gpu == "A100-80GB" and rest == ["strategy=ddp"]
    with pytest.raises(ConfigError, match=r"^plan\.gpus is not allowed: the plan's keys are plan\.gpu, plan\.dir$"):
        plan_options(["plan.gpus=A100-80GB"])


@pytest.mark.parametrize("strategy", ["tp", "deepspeed"])
def test_a_strategy_that_cannot_be_planned_yet_is_refused_in_one_line_saying_why(strategy):
    with pytest.raises(ConfigError) as refused:
        planned(*CHAR_LM, f"strategy={strategy}")
    line = str(refused.value)
    assert line.startswith(f"strategy={strategy} cannot be planned yet: ") and "plannable: single, ddp, fsdp" in line
    assert "\n" not in line


def test_plan_png_is_drawn_and_without_matplotlib_one_line_says_why(tmp_path, monkeypatch):
    rows = [Row(strategy="ddp", workers=w, micro_batch=64 // w, parameters=2 * MIB, gradients=0, optimizer=4 * MIB,
                activations=30 * MIB // w, temporaries=MIB, buffers=2 * MIB, batch=MIB // w, peak=40 * MIB // w,
                seconds=1.0) for w in (1, 2)]
    picture = tmp_path / "plan.png"
    assert write_png(rows, chosen_gpu("T4-16GB"), picture) == f"plan.png: {picture}"
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    missing = tmp_path / "missing.png"
    line = write_png(rows, None, missing)
    assert line.startswith("plan.png: not drawn (matplotlib is not installed") and not missing.exists()


def test_the_largest_micro_batch_found_fits_and_one_sample_more_does_not():
    cfg = composed(*LENET, "strategy=single")
    memory = 64 * MIB
    best = largest_micro_batch(cfg, plan_row(cfg), memory)
    assert best.peak <= memory < planned(*LENET, "strategy=single", f"trainer.batch_size={best.micro_batch + 1}").peak
    assert best.micro_batch > composed(*LENET).trainer.batch_size  # LeNet at 128 samples takes 22 MiB


def test_comma_lists_expand_in_order_and_a_one_process_strategy_is_planned_once(capsys):
    configs = list(composed_runs(["strategy=single,ddp", "strategy.nproc_per_node=1,2", *LENET], None))
    assert [(c.strategy.name, c.strategy.get("nproc_per_node")) for c in configs] == [("single", None), ("ddp", 1),
                                                                                   ("ddp", 2)]
    assert capsys.readouterr().out == ("strategy=single starts one process: planned once, without "
                                       "strategy.nproc_per_node\n")


def test_a_storage_resized_to_nothing_outside_any_op_is_counted_as_freed_at_the_next_op():
    """As FSDP2 frees its gathered parameters after a unit's forward: `untyped_storage().resize_(0)`, no op."""
    with LiveBytes() as live:
        gathered = torch.empty(1000)
        gathered.untyped_storage().resize_(0)
        later = torch.empty(500)
    assert live.now()[TEMPORARIES] == 4 * 500 and live.peak == 4 * 1000
    del gathered, later
