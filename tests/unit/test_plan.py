"""The plan (framework/plan/), in this process: its parameter, optimizer and buffer terms against their closed
forms (AdamW: two fp32 moments and a step count per parameter tensor; fsdp: rank 0's padded shard, 1/N), LeNet's
planned peak against the peak torch.profiler measures on a real step, the largest micro-batch that fits, plan.png,
the device constants a fit leaves room for, trainer.check_fit's refusal (the driver's GPU path, given a card), and
its refusals in one line; pipeline rows (the micro-batches each schedule keeps in flight), ZeRO-3's model state,
the model built fake (no real weights), and check_fit letting a run start when the planner fails."""
import gzip
import json
import math
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.profiler import ProfilerActivity, profile

from support.driver import composed

from framework.assemble import RunContext, build_task, parallelize, seed_everything
from framework.common.errors import ConfigError
from framework.config.settings import settings_of
from framework.config.targets import TargetAllowlist, allowing
from framework.plan.batch import first_batch
from framework.plan.command import composed_runs, plan_options
from framework.plan.device_constants import constants_of
from framework.plan.fit import check_fit
from framework.plan.gpus import Gpu, chosen_gpu
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


def test_tp_keeps_half_of_the_split_layers_and_adamw_two_moments_of_what_the_rank_keeps():
    row = planned(*CHAR_LM, "strategy=tp", "strategy.nproc_per_node=2")
    numels = [s.numel() for s in shapes(*CHAR_LM)]
    whole = 4 * sum(numels)
    assert whole / 2 < row.parameters < whole  # the tied embedding stays whole on every rank
    assert row.optimizer == 2 * row.parameters + 4 * len(numels)
    assert row.micro_batch == composed(*CHAR_LM).trainer.batch_size  # tp peers see the same batch


def test_a_mesh_whose_degrees_do_not_make_its_workers_is_refused_as_train_py_refuses_it():
    with pytest.raises(ConfigError, match=r"^strategy\.tp=2 = 2 worker\(s\) is not allowed with 4 worker\(s\)"):
        planned(*CHAR_LM, "strategy=tp", "strategy.nproc_per_node=4")


def test_zero_2_holds_whole_parameters_and_a_partition_of_master_weights_gradients_and_moments_and_its_bucket():
    row = planned(*CHAR_LM, "strategy=deepspeed", "strategy.nproc_per_node=2")
    numels = [s.numel() for s in shapes(*CHAR_LM)]
    params, partition = 4 * sum(numels), math.ceil(4 * sum(numels) / 2)
    assert row.parameters == params + partition and row.gradients == partition
    assert row.optimizer == math.ceil(adamw_bytes(numels, len(numels)) / 2)
    assert row.buffers == 500_000_000 * 4  # DeepSpeed's default reduce_bucket_size, in fp32, whatever the model
    smaller = planned(*CHAR_LM, "strategy=deepspeed", "strategy.nproc_per_node=2",
                      "+strategy.config.zero_optimization.reduce_bucket_size=1000000")
    assert smaller.buffers == 4_000_000 and row.peak - smaller.peak == row.buffers - smaller.buffers
    assert row.micro_batch == composed(*CHAR_LM).trainer.batch_size // 2


def test_zero_3_keeps_each_tensors_partition_its_fp32_copy_and_gradients_and_the_tensors_it_gathers_whole():
    zero3 = (*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=3", "strategy.nproc_per_node=2",
             "+strategy.config.zero_optimization.reduce_bucket_size=1000000")
    numels = [s.numel() for s in shapes(*CHAR_LM)]
    partition = 4 * sum(math.ceil(n / 2) for n in numels)
    row = planned(*zero3)  # every tensor of the GPT is under 1e5 elements: persistent, whole on every rank
    assert max(numels) <= 100_000 and row.parameters == 4 * sum(numels) + 2 * partition
    assert row.gradients == partition and row.buffers == 4_000_000  # one reduction bucket, overlap_comm or not
    assert row.optimizer == math.ceil(adamw_bytes(numels, len(numels)) / 2)
    capped = planned(*zero3, "+strategy.config.zero_optimization.stage3_param_persistence_threshold=0",
                     "+strategy.config.zero_optimization.stage3_max_live_parameters=100000")
    assert capped.parameters == 4 * 100_000 + 2 * partition  # none persistent; at most max_live gathered
    assert row.peak - capped.peak == row.parameters - capped.parameters


def test_zero_0_is_refused_in_one_line_saying_why():
    with pytest.raises(ConfigError, match=r"^strategy\.zero_stage=0 cannot be planned yet: stage 0 reduces the "
                                          r"whole gradients .*plannable: strategy\.zero_stage=1, 2 or 3$"):
        planned(*CHAR_LM, "strategy=deepspeed", "strategy.zero_stage=0")


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


def test_a_strategy_that_cannot_be_planned_yet_is_refused_in_one_line_saying_why():
    with pytest.raises(ConfigError) as refused:
        planned(*CHAR_LM, "strategy=dp")
    line = str(refused.value)
    assert line.startswith("strategy=dp cannot be planned yet: ")
    assert "plannable: single, ddp, fsdp, tp, pp, deepspeed" in line
    assert "\n" not in line


@pytest.mark.parametrize("overrides", [("strategy.schedule=Interleaved1F1B",), ("strategy.tp=2",)],
                         ids=["interleaved", "pp_x_tp"])
def test_a_pipeline_not_checked_against_a_real_run_is_refused_in_one_line(overrides):
    with pytest.raises(ConfigError) as refused:
        planned(*CHAR_LM, "strategy=pp", f"strategy.nproc_per_node={2 * (1 + ('strategy.tp=2' in overrides))}",
                *overrides)
    line = str(refused.value)
    assert "cannot be planned yet" in line and "plannable:" in line and "\n" not in line


def test_1f1b_keeps_pp_micro_batches_in_flight_on_the_first_rank_and_gpipe_all_of_them():
    """pp=2 over 4 pipeline micro-batches: rank 0 under 1F1B holds the activations of 2 at its peak (a forward for
    each stage, then one backward for each forward), under GPipe all 4; the row is the pipeline rank whose peak is
    the largest."""
    pp = ("strategy=pp", "strategy.nproc_per_node=2", "strategy.microbatches=4")
    cfg = {schedule: composed(*CHAR_LM, *pp, f"strategy.schedule={schedule}", "trainer.accelerator=cpu")
           for schedule in ("1F1B", "GPipe")}
    first = {schedule: plan_row(c, rank=0) for schedule, c in cfg.items()}
    assert first["1F1B"].activations / first["GPipe"].activations == pytest.approx(2 / 4, rel=0.01)
    assert first["1F1B"].parameters == first["GPipe"].parameters < planned(*CHAR_LM, "strategy=single").parameters
    last = plan_row(cfg["GPipe"], rank=1)
    assert plan_row(cfg["GPipe"]).peak == max(first["GPipe"].peak, last.peak)


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


def test_a_peak_that_fits_the_card_as_sold_does_not_fit_beside_its_device_constants_and_nccl_takes_more():
    h100 = constants_of("NVIDIA H100 80GB HBM3")  # as torch names the card
    assert h100 == constants_of("H100-80GB") and constants_of("NVIDIA GeForce RTX 4090").kind == "RTX4090"
    assert constants_of("NVIDIA A10").kind == "A10" and constants_of("a card nobody knows").kind == "another GPU"
    card = Gpu("H100-80GB", 80 * 2 ** 30, h100)
    peak = 80 * 2 ** 30 - MIB
    assert not card.fits(peak, 1)
    assert card.fits(card.room(1), 1) and not card.fits(card.room(1) + 1, 1)
    assert card.room(1) - card.room(2) == pytest.approx(h100.nccl / (1 + h100.rounding), abs=1)


def test_check_fit_refuses_a_run_whose_planned_peak_exceeds_the_gpu_in_one_line_naming_the_key():
    cfg = composed(*LENET, "strategy=single", "trainer.check_fit=true", "trainer.accelerator=cpu")
    constants = constants_of("H100")
    fixed = constants.cuda_context + constants.allocated_beside_tensors()
    peak = plan_row(cfg).peak  # LeNet, 128 samples: 21.7 MiB
    small = Gpu("a small card", fixed + peak, constants)  # the tensors fit the card, not beside its constants
    with pytest.raises(ConfigError) as refused:
        check_fit(cfg, 1, small, say=pytest.fail)
    line = str(refused.value)
    assert line.startswith("trainer.check_fit: this run does not fit a small card: rank 0's planned peak is 22 MiB")
    assert "trainer.check_fit=false" in line and "\n" not in line
    said = []
    check_fit(cfg, 1, Gpu("a larger card", fixed + 2 * peak, constants), said.append)
    assert said == []  # it fits: no line, no refusal


def test_check_fit_says_in_one_line_that_a_run_it_cannot_plan_is_not_checked():
    said = []
    check_fit(composed(*CHAR_LM, "strategy=dp", "trainer.accelerator=cpu"), 2, chosen_gpu("T4-16GB"), said.append)
    assert len(said) == 1 and said[0].startswith("trainer.check_fit: not checked: strategy=dp cannot be planned yet")


def test_check_fit_lets_the_run_start_with_one_line_when_the_planner_itself_fails(monkeypatch):
    """The planner (a dependency of check_fit, not its subject) raising something other than a refusal: check_fit
    returns (the driver goes on to start the run) and says, in one line, that the plan could not be made."""
    def failing(cfg, workers):
        raise RuntimeError("a kernel fake tensors do not know\nits second line")

    monkeypatch.setattr("framework.plan.fit.plan_row", failing)
    said = []
    check_fit(composed(*LENET, "strategy=single", "trainer.accelerator=cpu"), 1, chosen_gpu("T4-16GB"), said.append)
    assert said == ["trainer.check_fit: not checked: planning failed (RuntimeError: a kernel fake tensors do not "
                    "know); trainer.check_fit=false skips the plan"]


def test_the_plan_builds_the_model_fake_and_allocates_none_of_its_weights():
    """build_task's model_made_in, as the plan calls it: a GPT of 200 MB of fp32 weights built under FakeTensorMode;
    the CPU allocator (torch.profiler's memory events, independent of the fake mode) sees a small fraction of that
    (the data), and every parameter is fake."""
    cfg = composed(*CHAR_LM, "model.n_embd=1024", "model.n_layer=4", "trainer.accelerator=cpu")
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        s = settings_of(cfg, strategy_class.Options)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
            task = build_task(s, torch.device("cpu"), "a unit test", model_made_in=FakeTensorMode())
    weights = sum(p.numel() * p.element_size() for p in task.model.parameters())
    allocated = sum(e.nbytes() for e in profiler.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.nbytes() > 0)
    assert weights > 150 * MIB and allocated < weights / 10
    assert all(isinstance(p, FakeTensor) for p in task.model.parameters())


def test_a_users_strategy_yaml_of_the_mesh_plans_by_its_degrees_not_its_name(monkeypatch):
    """examples/my_project's strategy=tp_plan names the mesh engine under a name of its own: planned as tp=2."""
    from support.processes import EXAMPLE

    monkeypatch.syspath_prepend(str(EXAMPLE))
    cfg = next(composed_runs(["experiment=task_residual_lm", "strategy=tp_plan", "trainer.accelerator=cpu",
                              "trainer.batch_size=16"], str(EXAMPLE / "conf")))
    row = plan_row(cfg)
    assert (row.strategy, row.workers) == ("tp_plan", 2) and row.peak > row.parameters > 0
