"""verify.py in this process: its refusals (one line, exit 2, before any run starts), the overrides its runs get (they
compose and pass train.py's checks), the candidates it finds in a model, what switching them off does to the modules,
and how two runs' numbers are judged. The runs themselves: tests/runs/test_verify.py."""
import copy

import pytest
import torch
from torch import nn

from framework.callbacks.stop_after import StopAfter
from framework.callbacks.switch_off import BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS, SwitchOff
from framework.config.strategy_options import DDPOptions, FSDPOptions
from framework.verify.causes import candidates, left_over, switched_off, together
from framework.verify.compare import ROUNDING_MARGIN, Comparison, Drift, weight_difference
from framework.verify.runs import first_steps, one_process, without
from support.driver import command_in_process, driver_says
from verify_subjects import BatchNormCNN, DropoutNet


def verify_says(args, tmp_path, monkeypatch, capsys):
    code, out, err = command_in_process("verify_main", ["verify.py", *args], tmp_path, monkeypatch, capsys)
    return code, out, err.strip()


@pytest.mark.parametrize("args, line", [
    (["strategy=single"], "error: strategy=single is not allowed with verify.py: it compares a run of several "
                          "workers with one process, and this is one process; name the strategy to check, e.g. "
                          "strategy=ddp"),
    # no GPU here: auto is one process
    ([], "error: strategy=single is not allowed with verify.py (strategy=auto chose it on this machine)"),
    (["strategy=ddp", "verify.steps=0"], "error: verify.steps=0 is not allowed: expected an integer >= 1"),
    (["strategy=ddp", "verify.loss_tolerance=-1"], "error: verify.loss_tolerance=-1.0 is not allowed: expected a "
                                                   "number > 0"),
    (["strategy=ddp", "trainer.resume=/nowhere/step-4.pt"],
     "error: trainer.resume=/nowhere/step-4.pt is not allowed with verify.py: it compares two runs from the same start"),
])
def test_a_refusal_is_one_line_and_exit_2_before_any_run(tmp_path, monkeypatch, capsys, args, line):
    code, out, err = verify_says(args, tmp_path, monkeypatch, capsys)
    assert code == 2 and err.startswith(line) and "\n" not in err, err
    assert not list(tmp_path.rglob("verify/*")), "no run started"


def test_train_pys_own_refusals_are_verify_pys(tmp_path, monkeypatch, capsys):
    args = ["strategy=ddp", "trainer.batch_size=7"]
    expected = driver_says(args, tmp_path / "driver")
    assert expected
    code, _, err = verify_says(args, tmp_path, monkeypatch, capsys)
    assert code == 2 and err == f"error: {expected}"


def test_the_runs_overrides_compose_and_pass_train_pys_checks(tmp_path):
    """What verify adds to the user's overrides is a valid train.py command line: the first steps (an evaluation
    and a stop there), each switch, and the one-process run."""
    user = ["strategy=ddp", "strategy.nproc_per_node=2", "strategy.bucket_cap_mb=10", "trainer.batch_size=64"]
    for extra in ([], switched_off(BATCHNORM_STATISTICS), switched_off(TRAINING_MODE_DRAWS),
                  ["dataset.augment=null", "trainer.precision=fp32"]):
        for args in ([*user, *extra], one_process([*user, *extra])):
            assert driver_says([*args, *first_steps(5)], tmp_path) == "", args
    both = together(candidates(BatchNormCNN((1, 28, 28), 10), FSDPOptions(), "fsdp", "fp32", None))
    assert driver_says([*user, *both.both, *first_steps(5)], tmp_path) == ""


def test_the_one_process_run_keeps_everything_but_the_strategy():
    user = ["strategy=fsdp", "strategy.nproc_per_node=2", "+strategy.x=1", "~strategy.timeout", "trainer.seed=3",
            "trainer.batch_size=64", "trainer.precision=bf16", "dataset.max_train_samples=512"]
    assert one_process(user) == ["trainer.seed=3", "trainer.batch_size=64", "trainer.precision=bf16",
                                 "dataset.max_train_samples=512", "strategy=single"]
    assert without(["trainer.eval_every_n_steps=3", "trainer.eval_every_n_epochs=2"],
                   ("trainer.eval_every_n_steps",)) == ["trainer.eval_every_n_epochs=2"]


def test_candidates_are_what_the_model_and_settings_have():
    bn = candidates(BatchNormCNN((1, 28, 28), 10), DDPOptions(), "ddp", "fp32", None)
    assert [c.key for c in bn] == ["sync_batchnorm", "training_mode_draws"]
    assert bn[0].strategy_only == ["strategy.sync_batchnorm=true"] and not bn[0].both
    assert "features.1" in bn[0].name and "strategy.sync_batchnorm=true" in bn[0].found
    assert [c.key for c in candidates(BatchNormCNN((1, 28, 28), 10), DDPOptions(sync_batchnorm=True), "ddp", "fp32",
                                      None)] == ["training_mode_draws"], "synchronized already: no candidate"
    frozen = candidates(BatchNormCNN((1, 28, 28), 10), FSDPOptions(), "fsdp", "fp32", None)[0]
    assert frozen.key == "batchnorm_statistics" and frozen.both == switched_off(BATCHNORM_STATISTICS)
    assert "strategy=fsdp has no strategy.sync_batchnorm" in frozen.found
    dropout = candidates(DropoutNet((1, 28, 28), 10, dropout=0.3), DDPOptions(), "ddp", "bf16", {"_target_": "x"})
    assert [c.key for c in dropout] == ["training_mode_draws", "no_augment", "fp32"]
    assert dropout[0].name == "dropout (net.3: p=0.3)"
    assert dropout[2].both == ["trainer.precision=fp32"]
    assert candidates(DropoutNet((1, 28, 28), 10, dropout=0.0), DDPOptions(), "ddp", "fp32", None)[0].name.startswith(
        "a random draw in training mode")


def test_switched_off_together_is_one_callback_per_kind():
    found = candidates(BatchNormCNN((1, 28, 28), 10), FSDPOptions(), "fsdp", "bf16", None)
    both = together(found).both
    assert sorted(o for o in both if o.endswith("._target_=framework.callbacks.switch_off.SwitchOff")) == [
        f"+callbacks.verify_switch_off_{what}._target_=framework.callbacks.switch_off.SwitchOff"
        for what in sorted((BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS))]
    assert "trainer.precision=fp32" in both


class _State:
    def __init__(self, model):
        self.model = model


def test_switch_off_holds_its_modules_in_eval_mode_at_every_step():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Dropout(0.5), nn.InstanceNorm2d(2))
    for what, held in ((BATCHNORM_STATISTICS, {1}), (TRAINING_MODE_DRAWS, {None, 0, 2})):
        callback = SwitchOff(what)
        callback.on_fit_start(_State(model))
        model.train()  # what the loop does at every epoch's start
        callback.on_train_step_start(_State(model), 1)
        modes = {i: m.training for i, m in enumerate(model)}
        assert {i for i, training in modes.items() if not training} == held - {None}
        assert model.training is (None not in held)


def test_training_mode_draws_off_draws_no_dropout_mask():
    torch.manual_seed(0)
    model, x = DropoutNet((1, 8, 8), 3, dropout=0.5), torch.randn(4, 1, 8, 8)
    without_dropout = copy.deepcopy(model).eval()(x)
    assert not torch.allclose(model.train()(x), without_dropout)
    callback = SwitchOff(TRAINING_MODE_DRAWS)
    callback.on_fit_start(_State(model))
    callback.on_train_step_start(_State(model), 1)
    torch.testing.assert_close(model(x), without_dropout)


class _Stops:
    def __init__(self):
        self.reason = None

    def request_stop(self, reason):
        self.reason = reason


def test_stop_after_ends_the_run_at_its_step():
    state, callback = _Stops(), StopAfter(5)
    callback.on_evaluation_end(state, 4, None)
    assert state.reason is None
    callback.on_evaluation_end(state, 5, None)
    assert state.reason == "the first 5 steps are done"


def _comparison(one, other, weight_gap=0.0, drift=None):
    return Comparison("a", "b", list(range(1, len(one) + 1)), one, other, 1e-5, 1e-4, weight_gap, "w", drift)


def test_equal_within_the_tolerances_or_within_one_process_own_drift():
    assert _comparison([2.0, 1.0], [2.0, 1.0 + 5e-6]).equal
    late = _comparison([2.0, 1.0, 0.5], [2.0, 1.0, 0.5 * (1 + 3e-4)], weight_gap=2e-3)
    assert not late.equal and late.needs_drift and late.first_differing_step == 3
    late.drift = Drift("c", loss=3e-4 / ROUNDING_MARGIN, weights=2e-3 / ROUNDING_MARGIN)
    assert late.equal
    late.drift = Drift("c", loss=1e-6, weights=1e-6)
    assert not late.equal, "more than ten times one process's own drift"
    first = _comparison([2.0, 1.0], [2.0 * (1 + 2e-5), 1.0], drift=Drift("c", 1.0, 1.0))
    assert not first.equal and not first.needs_drift, "the first step's forward is never excused"


def test_weight_difference_is_the_worst_tensor_relative_to_its_norm():
    a = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([1.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 4.5]), "b": torch.tensor([1.0]), "n": torch.tensor(5)}
    assert weight_difference(a, b) == (pytest.approx(0.1), "w")
    assert weight_difference(a, {"w": a["w"]}) == (float("inf"), "b")


def test_what_is_left_says_when_step_one_is_the_world_size_times_one_process():
    lines = left_over(2, [2.3, 2.2], [4.6, 4.4], train=[])
    assert "(4.600000 against 2.300000, 2.0000 times), which is the number of workers (2)" in lines[0]
    assert lines[-1].startswith("not among the candidates: code of your own that reads the rank or the world size")
    assert len(left_over(2, [2.3], [2.3], train=[])) == 1
