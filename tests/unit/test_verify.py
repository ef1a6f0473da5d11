"""verify.py in this process: its refusals (one line, exit 2, before any run starts), the overrides its runs get (they
compose and pass train.py's checks, and take the layout and threads the strategy's run resolves), the candidates it
finds in a model, what switching them off does to the modules, and how two runs' numbers are judged against the
rounding floor. The floor's own run: tests/unit/test_verify_floor.py; the runs themselves: tests/runs/test_verify.py."""
import copy

import pytest
import torch
from torch import nn

from framework.assemble import build_task
from framework.callbacks.stop_after import StopAfter
from framework.callbacks.switch_off import BATCHNORM_STATISTICS, TRAINING_MODE_DRAWS, SwitchOff
from framework.config.strategy_options import preset
from framework.run import plan_run
from framework.session.environment import threads_per_worker
from framework.session.situations import Job
from framework.verify.causes import candidates, left_over, switched_off, together
from framework.verify.command import Verification
from framework.verify.compare import weight_difference
from framework.verify.runs import first_steps, one_process, without
from framework.verify.verdict import CANNOT_TELL, EQUAL, NOT_EQUAL, ROUNDING_MARGIN, Comparison, Floor
from support.driver import command_in_process, composed, driver_says
from verify_subjects import BatchNormCNN, DropoutNet

# issue 53's command: LeNet's layout resolves on in one process on the CPU and off under fsdp (which refuses it)
ISSUE_53 = ["strategy.nproc_per_node=2", "dataset=synthetic", "trainer.accelerator=cpu", "model=lenet",
            "trainer.batch_size=32", "lr_schedule=constant", "verify.steps=6"]


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
    both = together(candidates(BatchNormCNN((1, 28, 28), 10), preset("fsdp"), "fsdp", "fp32", None))
    assert driver_says([*user, *both.both, *first_steps(5)], tmp_path) == ""
    on_gpus = together(candidates(BatchNormCNN((1, 28, 28), 10), preset("fsdp"), "fsdp", "bf16", None, cuda=True))
    assert driver_says([*user, *on_gpus.both, *first_steps(5)], tmp_path) == ""


def test_the_one_process_run_keeps_everything_but_the_strategy():
    user = ["strategy=fsdp", "strategy.nproc_per_node=2", "+strategy.x=1", "~strategy.timeout", "trainer.seed=3",
            "trainer.batch_size=64", "trainer.precision=bf16", "dataset.max_train_samples=512"]
    assert one_process(user) == ["trainer.seed=3", "trainer.batch_size=64", "trainer.precision=bf16",
                                 "dataset.max_train_samples=512", "strategy=single"]
    assert without(["trainer.eval_every_n_steps=3", "trainer.eval_every_n_epochs=2"],
                   ("trainer.eval_every_n_steps",)) == ["trainer.eval_every_n_epochs=2"]


def test_candidates_are_what_the_model_and_settings_have():
    bn = candidates(BatchNormCNN((1, 28, 28), 10), preset("ddp"), "ddp", "fp32", None)
    assert [c.key for c in bn] == ["sync_batchnorm", "training_mode_draws"]
    assert bn[0].strategy_only == ["strategy.sync_batchnorm=true"] and not bn[0].both
    assert "features.1" in bn[0].name and "strategy.sync_batchnorm=true" in bn[0].found
    assert [c.key for c in candidates(BatchNormCNN((1, 28, 28), 10), preset("ddp", sync_batchnorm=True), "ddp", "fp32",
                                      None)] == ["training_mode_draws"], "synchronized already: no candidate"
    frozen = candidates(BatchNormCNN((1, 28, 28), 10), preset("fsdp"), "fsdp", "fp32", None)[0]
    assert frozen.key == "batchnorm_statistics" and frozen.both == switched_off(BATCHNORM_STATISTICS)
    assert "strategy=fsdp has no strategy.sync_batchnorm" in frozen.found
    dropout = candidates(DropoutNet((1, 28, 28), 10, dropout=0.3), preset("ddp"), "ddp", "bf16", {"_target_": "x"})
    assert [c.key for c in dropout] == ["training_mode_draws", "no_augment", "fp32"]
    assert dropout[0].name == "dropout (net.3: p=0.3)"
    assert dropout[2].both == ["trainer.precision=fp32"]
    assert candidates(DropoutNet((1, 28, 28), 10, dropout=0.0), preset("ddp"), "ddp", "fp32", None)[0].name.startswith(
        "a random draw in training mode")


def test_switched_off_together_is_one_callback_per_kind():
    found = candidates(BatchNormCNN((1, 28, 28), 10), preset("fsdp"), "fsdp", "bf16", None)
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


def _comparison(one, other, weight_gap=0.0, floor=None, floor_weights=0.0):
    """Two runs' losses step by step (the floor: one process against its floor run, step by step)."""
    measured = None if floor is None else Floor("c", "one process split", floor, floor_weights)
    return Comparison(one_process="a", strategy="b", steps=list(range(1, len(one) + 1)), one_losses=one,
                      strategy_losses=other, loss_tolerance=1e-5, weight_tolerance=1e-4, weight_gap=weight_gap,
                      worst_weight="w", floor=measured)


def test_equal_within_the_tolerances_or_within_ten_times_the_rounding_floor():
    assert _comparison([2.0, 1.0], [2.0, 1.0 + 5e-6]).verdict == EQUAL
    late = _comparison([2.0, 1.0, 0.5], [2.0, 1.0, 0.5 * (1 + 3e-5)], weight_gap=2e-4)
    assert late.verdict == NOT_EQUAL and late.needs_floor and late.first_differing_step == 3
    late.floor = Floor("c", "split", [1e-7, 2e-6, 3e-6], weights=2e-4 / ROUNDING_MARGIN)
    assert late.verdict == EQUAL and late.verdict_text().startswith("equal to one process over 3 steps")
    late.floor = Floor("c", "split", [1e-7, 1e-7, 1e-7], weights=2e-4 / ROUNDING_MARGIN)
    assert late.verdict == NOT_EQUAL and late.first_differing_step == 3, "more than ten times rounding alone"
    first = _comparison([2.0, 1.0], [2.0 * (1 + 2e-5), 1.0], floor=[9e-6, 9e-6], floor_weights=9e-5)
    assert first.verdict == NOT_EQUAL and first.first_differing_step == 1, "the first step's forward is never excused"
    assert not _comparison([2.0, 1.0], [2.0 * (1 + 2e-5), 1.0]).needs_floor
    blind_at_once = _comparison([2.0, 1.0], [2.0 * (1 + 2e-5), 1.0], floor=[3e-5, 3e-5])
    assert blind_at_once.verdict == NOT_EQUAL and blind_at_once.blind_from == 1, "not even by a floor past the tolerance"


def test_zero_difference_in_every_loss_and_weight_is_said_to_be_bitwise():
    """trainer.invariant's runs: verify.py reports 0 and says so; a gap anywhere, however small, is not bitwise."""
    assert _comparison([2.0, 1.0], [2.0, 1.0]).verdict_text() == (
        "equal to one process over 2 steps, bitwise: 0 difference in every step's loss and every weight")
    assert "bitwise" not in _comparison([2.0, 1.0], [2.0, 1.0], weight_gap=1e-9).verdict_text()
    assert "bitwise" not in _comparison([2.0, 1.0], [2.0, 1.0 + 1e-9]).verdict_text()


def test_the_floor_excuses_a_step_by_how_far_rounding_has_carried_so_far():
    """Rounding drift wanders: a step where the floor happens to read 0 still carries the drift of the steps before."""
    wandering = _comparison([2.0, 1.0, 0.5], [2.0, 1.0 * (1 + 4e-5), 0.5 * (1 + 4e-5)], floor=[0.0, 8e-6, 0.0])
    assert wandering.verdict == EQUAL


def test_past_the_step_where_rounding_alone_outgrows_the_tolerance_the_verdict_is_cannot_tell():
    """issue 53: `verify.py strategy=ddp dataset=fashion_mnist verify.steps=300` said "equal ... (loss 1.7e-01,
    weights 4.7e-01 relative at most; one process drifts from itself by loss 2.2e-01, weights 4.6e-01)". Once one
    process is further from itself than the tolerance, a gap can no longer be told from rounding."""
    steps = 300
    one = [2.3 - 0.005 * s for s in range(steps)]
    floor = [min(1e-7 * 1.1 ** s, 2.2e-1) for s in range(steps)]  # rounding grows tenfold every ~24 steps
    other = [a * (1 + 0.8 * f) for a, f in zip(one, floor)]
    compared = _comparison(one, other, weight_gap=4.7e-1, floor=floor, floor_weights=4.6e-1)
    crossing = next(s for s, f in enumerate(floor, 1) if f > 1e-5)  # the first step rounding passes the tolerance
    assert compared.verdict == CANNOT_TELL and compared.blind_from == crossing and compared.told == crossing - 1
    said = compared.verdict_text()
    assert said.startswith(f"equal to one process over the first {crossing - 1} step(s)"), said
    assert (f"from step {crossing} on the comparison can no longer tell equal from not: rounding alone carries one "
            f"process {floor[crossing - 1]:.1e} from itself there (one process split), more than "
            f"verify.loss_tolerance=1e-05; compare fewer steps (verify.steps={crossing - 1})") in said
    assert not compared.equal and not compared.weights_told, "the weights at the end are past that step"
    table = compared.table("ddp x2", most=steps)
    assert table[crossing].endswith("<- cannot tell") and not table[crossing - 1].endswith("<- cannot tell")


def test_a_difference_before_the_comparison_stops_telling_is_not_equal():
    floor = [1e-7, 1e-7, 1e-7, 5e-5]
    compared = _comparison([2.0, 1.5, 1.0, 0.5], [2.0, 1.5 * (1 + 5e-5), 1.0, 0.5 * 1.5], floor=floor)
    assert compared.verdict == NOT_EQUAL and compared.first_differing_step == 2 and compared.blind_from == 4
    blind_only = _comparison([2.0, 1.5, 1.0, 0.5], [2.0, 1.5, 1.0, 0.5 * 1.5], floor=floor)
    assert blind_only.verdict == CANNOT_TELL, "a gap past the step it stops telling is not a difference"
    assert _comparison([2.0, 1.0], [2.0, 1.0], floor=[2e-5, 2e-5]).verdict_text().startswith(
        "from step 1 on the comparison can no longer tell")


def test_weights_are_judged_only_where_rounding_alone_moves_them_less_than_the_tolerance():
    moved = _comparison([2.0, 1.0], [2.0, 1.0 + 2e-5], weight_gap=3e-3, floor=[0.0, 3e-6], floor_weights=2e-4)
    assert moved.verdict == CANNOT_TELL and moved.blind_from is None and not moved.weights_told
    assert "the weights at the end cannot tell: rounding alone moves them by 2.0e-04" in moved.verdict_text()
    off = _comparison([2.0, 1.0], [2.0, 1.0 + 2e-5], weight_gap=3e-3, floor=[0.0, 3e-6], floor_weights=2e-5)
    assert off.verdict == NOT_EQUAL and off.first_differing_step is None


def test_an_experiment_closes_a_gap_only_where_it_can_tell():
    baseline = _comparison([2.0, 1.5, 1.0], [2.0 * 1.001, 1.5, 1.0])  # differs at step 1
    closed_early = _comparison([2.0, 1.5, 1.0], [2.0, 1.5, 1.0 * 1.1], floor=[1e-7, 1e-7, 2e-5])
    assert closed_early.verdict == CANNOT_TELL and closed_early.tells_where(baseline)
    blind = _comparison([2.0, 1.5, 1.0], [2.0, 1.5, 1.0], floor=[2e-5, 2e-5, 2e-5])
    assert not blind.tells_where(baseline)


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


def _prepared(args: list[str], run_dir) -> Verification:
    """verify.py's preparation in this process: its refusals, train.py's checks, the runs' overrides (no run)."""
    verification = Verification(composed(*args, config_name="verify"), Job(run_dir, 0, tuple(args), (), ()))
    verification.prepare()
    return verification


def _layout_of(overrides: list[str], run_dir) -> bool:
    """trainer.channels_last as the run of these overrides resolves it where its workers train."""
    strategy, payload, _ = plan_run(composed(*overrides), run_dir, None)
    device = torch.device("cuda" if strategy.trainer.cuda else "cpu")
    return build_task(payload.settings, device, strategy.channels_last_refusal).channels_last


@pytest.mark.parametrize("strategy, layout", [("fsdp", False), ("ddp", True)])
def test_every_run_takes_the_layout_and_threads_the_strategys_run_resolves(tmp_path, monkeypatch, strategy,
                                                                           layout):
    """issue 53: with `trainer.channels_last=auto` the one-process run trained LeNet channels_last and fsdp did not
    (it refuses it): other convolution kernels, a ReLU flipped at step 1, "a defect of hydra-dist". Every run verify.py
    starts (the one-process runs included) must resolve the strategy's run's layout, and run its ranks' threads."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = [f"strategy={strategy}", *ISSUE_53]
    runner = _prepared(args, tmp_path / "verify").runner
    strategy_run = runner.overrides
    assert _layout_of([a for a in args if not a.startswith("verify.")], tmp_path / "alone") is layout
    for run in (one_process(strategy_run), strategy_run):
        assert _layout_of(run, tmp_path / "run") is layout, run
    assert runner.environment == {"OMP_NUM_THREADS": str(threads_per_worker(2))}
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _prepared(args, tmp_path / "again").runner.environment == {}, "the user's own setting is every run's"


OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity of 79.19 "
       "GiB of which 1.25 GiB is free.")


def test_a_one_process_run_out_of_gpu_memory_says_why_and_what_to_lower(tmp_path):
    """verify.py's one-process run trains the whole global batch on one GPU: a ddp run sized to fill its GPUs made it
    run out of memory, reported as 'the single run failed' with torch's last line."""
    from framework.verify.runs import _failure

    log = tmp_path / "single.log"
    log.write_text(f"Traceback (most recent call last):\n  ...\n{OOM}\n")
    line = _failure("single", 1, log)
    assert line.startswith("the single run ran out of GPU memory (exit 1): one process trains each step's whole "
                           "global batch on one GPU, where the strategy's run splits it over its workers; lower "
                           "trainer.batch_size for the comparison"), line
    assert "\n" not in line and line.endswith(f"its output: {log}")
    assert _failure("fp32/single", 1, log).startswith("the fp32/single run ran out of GPU memory (exit 1): one process")
    assert _failure("ddp", 1, log).startswith("the ddp run ran out of GPU memory (exit 1): lower trainer.batch_size")
    log.write_text("Traceback (most recent call last):\nValueError: something else\n")
    assert _failure("single", 1, log).startswith("the single run failed (exit 1): ValueError: something else")


def test_on_gpus_the_kernels_are_a_candidate_and_exact_kernels_switch_tf32_and_timing_off():
    """cuDNN's convolutions run TF32 by default and choose algorithms per batch shape: on a GPU two fp32 batch splits
    can differ at step 1 by that alone. On GPUs (only there) an experiment runs both with exact kernels."""
    from types import SimpleNamespace

    from framework.callbacks.exact_kernels import ExactKernels
    from framework.verify.causes import EXACT_KERNELS

    model = BatchNormCNN((1, 28, 28), 10)
    assert "exact_kernels" not in [c.key for c in candidates(model, preset("ddp"), "ddp", "bf16", None)]
    on_gpus = candidates(model, preset("ddp"), "ddp", "bf16", None, cuda=True)
    assert [c.key for c in on_gpus] == ["sync_batchnorm", "training_mode_draws", "exact_kernels", "fp32"]
    assert on_gpus[2].both == EXACT_KERNELS and not on_gpus[2].strategy_only
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark)
    try:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = True, True, False, True
        ExactKernels().on_fit_start(SimpleNamespace(device=torch.device("cpu")))
        assert cudnn.allow_tf32 and cudnn.benchmark, "the CPU: nothing changed"
        ExactKernels().on_fit_start(SimpleNamespace(device=torch.device("cuda", 0)))
        assert not matmul.allow_tf32 and not cudnn.allow_tf32 and cudnn.deterministic and not cudnn.benchmark
    finally:
        matmul.allow_tf32, cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark = before


def test_the_rounding_floor_on_a_gpu_also_runs_the_other_blas_library(monkeypatch):
    """Flipping cudnn.benchmark changes nothing where the timed choice is cuDNN's default one (and nothing for matrix
    products): the floor's other kernels also take the other BLAS library."""
    from types import SimpleNamespace

    from framework.callbacks.other_kernels import OtherKernels

    chosen = []
    current = SimpleNamespace(name="Cublas")
    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library",
                        lambda backend=None: chosen.append(backend) if backend else current)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    OtherKernels().on_fit_start(SimpleNamespace(device=torch.device("cuda", 0)))
    assert chosen == ["cublaslt"] and torch.backends.cudnn.benchmark
    current.name = "Cublaslt"
    OtherKernels().on_fit_start(SimpleNamespace(device=torch.device("cuda", 0)))
    assert chosen == ["cublaslt", "cublas"]
