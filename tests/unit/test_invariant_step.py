"""The world-size-invariant mode's step in one process (framework/training/invariant/step.py): the gradient it leaves
is the global batch's mean gradient (each micro-shard weighted 1/K), each shard's dropout and augmentation keyed by
where the shard is, and the meters' interval loss taken from the step's global loss sum. Across world sizes, as real
runs: tests/runs/test_invariant.py; the reducers on 1, 2 and 4 ranks: tests/dist/test_invariant_reducers.py."""
import copy

import pytest
import torch
from torch import nn

from framework.telemetry.meter import MeterSources, StepRecord
from framework.telemetry.meter_registry import METERS
from framework.telemetry.meters import IntervalMeter, IntervalSummary
from framework.telemetry.scalars import interval_scalars
from framework.training.engine import LocalGroup, Wrapped
from framework.training.invariant import FixedPointSum, GatheredTreeSum, InvariantStep, shard_draws
from framework.training.invariant.draws import augment_key
from framework.training.precision import Precision
from framework.training.step import Supervised

K, BATCH = 4, 16


def _wrapped(dropout: float) -> Wrapped:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(dropout), nn.ReLU(), nn.Linear(8, 3))
    return Wrapped(model, torch.optim.SGD(model.parameters(), lr=0.1), Precision("fp32", torch.device("cpu")),
                   None, model)


class _Data:
    step, loss = Supervised(), nn.CrossEntropyLoss(reduction="none")


def _batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 6, generator=generator), torch.randint(0, 3, (BATCH,), generator=generator)


def _keep(shard, generator):
    return shard


@pytest.mark.parametrize("reducer", [FixedPointSum, GatheredTreeSum])
def test_the_gradient_left_is_the_global_batchs_mean_gradient(reducer):
    wrapped, (x, y) = _wrapped(0.0), _batch()
    ran = InvariantStep(K, reducer(K), LocalGroup(torch.device("cpu")), 42, _keep).run(wrapped, _Data, (x, y), 3, 0)
    invariant = [p.grad.clone() for p in wrapped.model.parameters()]
    wrapped.model.zero_grad()
    losses = _Data.loss(wrapped.model(x), y)
    losses.mean().backward()
    for got, plain in zip(invariant, (p.grad for p in wrapped.model.parameters())):
        torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-7)
    assert [len(shard) for shard in ran.per_shard] == [BATCH // K] * K
    assert ran.global_sum.dtype == torch.float64
    assert ran.global_sum.item() == pytest.approx(losses.double().sum().item(), rel=1e-6)


def test_each_shards_dropout_is_drawn_from_its_own_key_whatever_was_drawn_before():
    (x, y), group = _batch(), LocalGroup(torch.device("cpu"))
    wrapped = _wrapped(0.5)
    step = InvariantStep(K, FixedPointSum(K), group, 42, _keep)
    first = step.run(wrapped, _Data, (x, y), 7, 0).per_shard
    torch.rand(100)  # the process's generator moved on: the shards' masks must not
    again = step.run(wrapped, _Data, (x, y), 7, 0).per_shard
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    shard = 2
    with shard_draws(42, 7, shard, group.devices):  # shard 2 alone, as a rank owning it would run it
        alone = _Data.loss(wrapped.model(x[shard::K]), y[shard::K])
    assert torch.equal(alone.detach(), first[shard])
    assert not torch.equal(step.run(wrapped, _Data, (x, y), 8, 0).per_shard[shard], first[shard]), "another step"


def test_each_shard_is_augmented_with_a_generator_keyed_by_epoch_step_and_shard():
    seen = []

    def record(shard, generator):
        seen.append(generator.initial_seed())
        return shard

    InvariantStep(K, FixedPointSum(K), LocalGroup(torch.device("cpu")), 42, record).run(_wrapped(0.0), _Data,
                                                                                           _batch(), 5, 1)
    assert seen == [augment_key(42, 1, 5, k) for k in range(K)]
    assert len(set(seen)) == K and augment_key(42, 0, 5, 0) != augment_key(42, 1, 5, 0)


def test_the_interval_loss_is_the_global_sum_over_the_samples_and_each_slot_keeps_its_own():
    """The mode's meter (InvariantStep.meters, added at assembly; not a registered one) gives loss/train."""
    assert not set(InvariantStep.meters) & set(METERS)
    meter = IntervalMeter(MeterSources([4], torch.device("cpu")), METERS + InvariantStep.meters)
    # the step's loss over both ranks' 8 samples
    meter.add(StepRecord(1, [torch.tensor([1.0, 1.0, 1.0, 1.0])], global_loss=torch.tensor(6.0, dtype=torch.float64)))
    rows = meter.rows()
    summary = IntervalSummary.from_rows(torch.cat([rows, rows]), meter.kinds)  # two ranks, the same global sum
    assert summary.loss == 6.0 / 8 and interval_scalars(summary, 0.1)["loss/train"] == 6.0 / 8
    assert summary.per_slot_loss == [1.0, 1.0]
    plain = IntervalMeter(MeterSources([4], torch.device("cpu")))
    plain.add(StepRecord(1, [torch.tensor([1.0, 1.0, 1.0, 3.0])]))
    assert IntervalSummary.from_rows(plain.rows()).loss == 1.5, "without the mode's meter: the ranks' own sums"


@pytest.mark.parametrize("reducer", [FixedPointSum, GatheredTreeSum])
def test_a_channels_last_weights_summed_gradient_keeps_its_layout_and_a_fused_optimizer_steps_it_right(reducer):
    """trainer.channels_last (auto on the CPU for LeNet, asked for on GPUs): backward leaves a channels_last weight a
    channels_last gradient, and fused optimizers read parameter and gradient in memory order. The sum came back
    contiguous: CUDA's fused Adam refuses it ("must have same dtype, device, and layout") and the CPU's stepped the
    wrong elements."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 3)).to(
        memory_format=torch.channels_last)
    x = torch.randn(BATCH, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 3, (BATCH,))
    stepped = {}
    for fused in (False, True):
        twin = copy.deepcopy(model)
        optimizer = torch.optim.Adam(twin.parameters(), lr=0.1, fused=fused, foreach=None if fused else False)
        wrapped = Wrapped(twin, optimizer, Precision("fp32", torch.device("cpu")), None, twin)
        InvariantStep(K, reducer(K), LocalGroup(torch.device("cpu")), 42, _keep).run(wrapped, _Data, (x, y), 1, 0)
        assert all(p.grad.stride() == p.stride() for p in twin.parameters())
        optimizer.step()
        stepped[fused] = [p.detach().clone() for p in twin.parameters()]
    for plain, fused in zip(stepped[False], stepped[True]):  # fused Adam rounds its own way; a misread element is
        torch.testing.assert_close(fused, plain, rtol=0, atol=1e-6)  # off by about 2 x lr


@pytest.mark.parametrize("invariant", [True, False])
def test_assembly_registers_the_modes_loss_meter_only_in_the_mode(tmp_path, invariant):
    """The run's meters, as a worker assembles them (one process, single): the registered ones, and the invariant
    mode's own where trainer.invariant is on (the runs' loss is bitwise equal across world sizes without it too:
    float64 sums of float32 losses are exact there, so tests/runs/test_invariant.py cannot tell)."""
    from support.driver import composed

    from framework.assemble import RunContext, build_task, loop_telemetry, parallelize, seed_everything
    from framework.config.settings import settings_of
    from framework.config.targets import TargetAllowlist, allowing
    from framework.strategies import choose_strategy
    from framework.training.invariant.loss_meter import GlobalLossMeter

    cfg = composed("dataset=synthetic", "strategy=single", "trainer.accelerator=cpu", f"trainer.invariant={invariant}")
    with allowing(TargetAllowlist.of_command(cfg)):
        strategy_class, _ = choose_strategy(cfg, None)
        s = settings_of(cfg, strategy_class.Options)
        seed_everything(s.trainer.seed)
        task = build_task(s, torch.device("cpu"), "")
        ctx = RunContext(settings=s, strategy=strategy_class(s.strategy, s.trainer.engine(), ranks=None),
                         group=LocalGroup(torch.device("cpu")), ranks=None, run_dir=tmp_path, say=print, stop=None)
        meter = loop_telemetry(ctx, parallelize(ctx, task), task, s.trainer.batch_size, "not counted").meter
    assert meter.kinds == METERS + ((GlobalLossMeter,) if invariant else ())
    assert ("global_loss_sum" in meter.columns) == invariant
