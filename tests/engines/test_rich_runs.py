"""Every feature that composes with an engine, in one run per engine (support/references.py: RICH), each run checked
for each feature's effect and for the loss of one process running the same features at every step: gradient
accumulation and clipping, two parameter groups, torch's lr schedulers by _target_ (StepLR, OneCycleLR under ddp,
ReduceLROnPlateau under fsdp), an evaluation every 4 steps, activation checkpointing and torch.compile (aot_eager;
inductor, the default backend: test_inductor.py) of the blocks each engine chooses, and the EMA of the weights where
the engine allows it (single, dp, ddp, horovod).
Real train.py runs with 2 gloo workers (horovod through its own runner), shared through the run cache; a run killed
mid-way and resumed continues the same losses, lrs, evaluations and average. eval.py evaluates what each run saved.
The mechanisms themselves are checked in-process in tests/unit (test_training_knobs.py, test_speedups.py,
test_loop_features.py)."""
import json

import pytest
import torch
from safetensors.torch import load_file

from framework.assemble import build_task
from framework.config.settings import settings_of
from framework.strategies import strategy_class
from framework.worker import seed_everything
from support.driver import command_in_process, composed
from support.processes import assert_killed_run_resumes, check_ok, run_train, user_code_env
from support.references import EMA_ENGINES, ENGINES, EVAL_EVERY, FROZEN, GROUP_SCALES, LR, RICH_STEPS, rich, rich_run
from support.run_files import assert_same_losses, losses_by_step, read_scalars, run_dirs, walk

# engine: the scheduler its run steps (the single-process reference runs the same one)
SCHEDULER = {"single": "step", "dp": "step", "ddp": "one_cycle", "fsdp": "plateau", "horovod": "step",
             "zero1": "step", "zero3": "step"}
NEEDS = {"horovod": "horovod.torch", "zero1": "deepspeed", "zero3": "deepspeed"}
# which modules each engine compiles and recomputes (fsdp: its fully_shard units; DeepSpeed compiles through its
# engine, the module it wraps: "" too)
BLOCKS = ["features", "classifier"]
COMPILED = {"fsdp": BLOCKS}
# fp32: what differs from one process is the order of float sums (about 1e-7 relative)
REL = 1e-5


def args_of(engine: str) -> list[str]:
    return rich_run(engine, SCHEDULER[engine])


def reference_args(engine: str) -> list[str]:
    """One process with the engine's features (the same scheduler, the EMA where the engine has it)."""
    return [*ENGINES["single"], *rich(SCHEDULER[engine], ema=engine in EMA_ENGINES)]


def rich_of(runs, engine: str):
    if engine in NEEDS:
        pytest.importorskip(NEEDS[engine])
    return runs.train(args_of(engine), env=user_code_env()).ok()


def rich_reference(runs, engine: str):
    return runs.train(reference_args(engine), env=user_code_env()).ok()


def group_lrs_logged(run_dir) -> dict[int, list[float]]:
    scalars = read_scalars(run_dir)
    by_group = [dict(scalars[f"lr/{name}"]) for name in GROUP_SCALES]
    return {step: [lrs[step] for lrs in by_group] for step in sorted(by_group[0])}


def lrs_by_hand(scheduler: str, accuracy: dict[int, float]) -> dict[int, list[float]]:
    """torch's own loop over three groups of the run's lrs: the lr of each at steps 1..RICH_STEPS (ReduceLROnPlateau
    stepped on the accuracy each evaluation gave)."""
    scales = list(GROUP_SCALES.values())
    optimizer = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": LR * s} for s in scales],
                                lr=LR)
    made = {"step": lambda: torch.optim.lr_scheduler.StepLR(optimizer, step_size=8, gamma=0.5),
            "one_cycle": lambda: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[0.1 * s for s in scales],
                                                                     total_steps=RICH_STEPS),
            "plateau": lambda: torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.5,
                                                                          patience=0, threshold=0.9)}[scheduler]()
    seen = {}
    for step in range(1, RICH_STEPS + 1):
        seen[step] = [g["lr"] for g in optimizer.param_groups]
        optimizer.step()
        if scheduler != "plateau":
            made.step()
        elif step in accuracy:
            made.step(accuracy[step])
    return seen


@pytest.fixture(scope="module")
def initial_state():
    """The model every worker of every rich run starts from: seeded, built as the worker builds it (before any
    engine wraps it)."""
    cfg = composed(*args_of("single"), "trainer.accelerator=cpu")
    settings = settings_of(cfg, strategy_class(cfg.strategy).Options)
    seed_everything(settings.trainer.seed)
    return build_task(settings, torch.device("cpu"), None).model.state_dict()


@pytest.mark.parametrize("engine", [e for e in SCHEDULER if e != "single"])
def test_the_rich_run_has_the_loss_of_one_process_at_every_step(runs, engine):
    """Accumulation and clipping (the engine's own: DDP's no_sync, fully_shard's unsharded steps, DeepSpeed's
    boundary and gradient_clipping, Horovod's backward_passes_per_step and synchronize), with the rest on."""
    run, reference = rich_of(runs, engine), rich_reference(runs, engine)
    expected, got = losses_by_step(reference.run_dir), losses_by_step(run.run_dir)
    assert sorted(got) == sorted(expected) == list(range(1, RICH_STEPS + 1))
    assert_same_losses(expected, got, range(1, RICH_STEPS + 1), REL, ("one process", engine))
    result = run.result()
    assert result["processes"] == (1 if engine == "dp" else 2) and result["steps"] == RICH_STEPS
    assert len(result["per_rank_samples_per_sec"]) == result["processes"]
    assert result["test_loss"] == pytest.approx(reference.result()["test_loss"], rel=REL), "evaluation on every rank"
    if engine.startswith("zero"):
        config = json.loads((run.run_dir / "deepspeed_config.json").read_text())
        assert config["gradient_accumulation_steps"] == 2 and config["gradient_clipping"] == 0.25
        assert config["train_micro_batch_size_per_gpu"] == 8


@pytest.mark.parametrize("engine", list(SCHEDULER))
def test_two_groups_and_a_torch_scheduler(runs, initial_state, engine):
    """The checkpoints hold the groups with their settings, the frozen parameters end where they started,
    weights/*.safetensors hold the same tensors as weights/*.pt, and TensorBoard's lr of every group is torch's own
    scheduler stepped by hand."""
    run_dir = rich_of(runs, engine).run_dir
    manifest = json.loads(sorted((run_dir / "checkpoints").glob("step-*.json"))[-1].read_text())
    groups = {g["name"]: g for g in manifest["param_groups"]}
    assert list(groups) == list(GROUP_SCALES)
    assert groups["frozen"]["lr_scale"] == 0.0 and groups["frozen"]["lr"] == 0.0
    assert groups["no_decay"]["weight_decay"] == 0.0 and groups["default"]["weight_decay"] == 0.01
    assert manifest["signature"]["param_groups"][0]["name"] == "frozen"

    last = load_file(run_dir / "weights" / "last.safetensors")
    assert set(last) == set(initial_state)
    for name, tensor in initial_state.items():
        unchanged = torch.equal(last[name], tensor)
        assert unchanged == name.startswith(FROZEN), f"{name}: {'unchanged' if unchanged else 'trained'}"
    for which in ("best", "last"):
        pt = torch.load(run_dir / "weights" / f"{which}.pt", weights_only=True)["model"]
        st = load_file(run_dir / "weights" / f"{which}.safetensors")
        assert set(pt) == set(st) and all(torch.equal(pt[k], st[k]) for k in pt)

    accuracy = dict(read_scalars(run_dir)["acc/val"])
    logged, expected = group_lrs_logged(run_dir), lrs_by_hand(SCHEDULER[engine], accuracy)
    assert sorted(logged) == list(range(1, RICH_STEPS + 1))
    for step in logged:
        assert logged[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    assert len(set(map(tuple, logged.values()))) > 1, "the scheduler moved the lr"


@pytest.mark.parametrize("engine", list(SCHEDULER))
def test_evaluation_every_n_steps_keeps_the_best_checkpoint(runs, engine):
    run_dir = rich_of(runs, engine).run_dir
    accuracies = dict(read_scalars(run_dir)["acc/val"])
    assert sorted(accuracies) == list(range(EVAL_EVERY, RICH_STEPS + 1, EVAL_EVERY))  # none twice at the end
    best_step = max(accuracies, key=lambda s: (accuracies[s], -s))  # the first evaluation with the best value
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == f"step-{best_step:08d}.json"
    weights = torch.load(run_dir / "weights" / "best.pt", weights_only=True)
    assert weights["step"] == best_step and weights["objective"]["value"] == pytest.approx(accuracies[best_step])


@pytest.mark.parametrize("engine", list(SCHEDULER))
def test_every_rank_trains_compiled_and_recomputed_blocks_and_eval_py_loads_the_weights(runs, tmp_path, engine,
                                                                                        monkeypatch, capsys):
    """Each rank's probe (support/user_code/speedup_probe.py) names what the worker really compiled and recomputes;
    the weights keep the plain model's keys (no _orig_mod. or _checkpoint_wrapped_module.), and eval.py on one
    process gets the run's own result from them: the EMA's (weights/ema.pt, which the run's evaluations scored)
    where the engine has one, the last weights' elsewhere. eval.py's command runs in this process (strategy=single
    evaluates in its driver): its subject is the weights, not a process."""
    run = rich_of(runs, engine)
    probes = [json.loads(p.read_text()) for p in sorted(run.run_dir.glob("speedup_probe.rank*.json"))]
    assert len(probes) == run.result()["processes"]
    assert all(p["compiled"] == COMPILED.get(engine, [""]) and p["recomputed"] == BLOCKS for p in probes), probes
    losses = losses_by_step(run.run_dir)
    assert sum(losses[s] for s in (14, 15, 16)) < sum(losses[s] for s in (1, 2, 3)), losses
    from framework.models.lenet import LeNet

    which = "ema" if engine in EMA_ENGINES else "last"
    weights = torch.load(run.run_dir / "weights" / f"{which}.pt", map_location="cpu", weights_only=True)["model"]
    assert list(weights) == list(LeNet((1, 28, 28), 10).state_dict())
    code, out, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={run.run_dir / 'weights' / f'{which}.pt'}",
                                                      "strategy=single"], tmp_path, monkeypatch, capsys)
    assert code == 0, out + err
    [report] = walk(tmp_path / "outputs", "eval.json")
    evaluated = json.loads(report.read_text())
    assert evaluated["test_acc"] == pytest.approx(run.result()["test_acc"], abs=1e-6)
    assert evaluated["test_loss"] == pytest.approx(run.result()["test_loss"], rel=1e-5)


@pytest.mark.parametrize("engine", EMA_ENGINES)
def test_the_ema_is_checkpointed_and_is_not_the_weights(runs, engine):
    run_dir = rich_of(runs, engine).run_dir
    ema = torch.load(run_dir / "weights" / "ema.pt", weights_only=True)["model"]
    last = torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]
    assert any(not torch.equal(ema[k], last[k]) for k in last), "the average is not the weights"
    state = torch.load(sorted((run_dir / "checkpoints").glob("step-*.pt"))[-1], weights_only=True)
    assert {f"module.{k}" for k in last} <= set(state["callbacks"]["ema"]), "each checkpoint holds the average"


# engine: the fault that stops it (the rank that dies) and the checkpoint it resumes from
KILLS = {"single": ("kill_in_eval:8:0", 8), "ddp": ("kill_after_step:10:1", 8), "fsdp": ("kill_after_step:10:0", 8),
         "horovod": ("kill_after_step:10:1", 8)}


@pytest.mark.parametrize("engine", list(KILLS))
def test_a_killed_run_resumes_with_the_same_losses_lrs_evaluations_and_average(runs, tmp_path, engine):
    """Killed (single: as the evaluation after step 8 starts, just after its step-8 checkpoint), then run again in
    its folder: it resumes from the checkpoint and gives the uninterrupted run's losses and lrs to the bit, its
    evaluations on the same clock with the same values (they score the EMA where the engine has it, so an average
    restarted from the weights would show) and the same weights/ema.pt."""
    reference = rich_of(runs, engine).run_dir
    fault, resumed_from = KILLS[engine]
    run_dir = assert_killed_run_resumes(tmp_path, args_of(engine), fault, reference, RICH_STEPS, resumed_from,
                                        env=user_code_env())
    assert group_lrs_logged(run_dir) == group_lrs_logged(reference)
    expected, got = read_scalars(reference)["acc/val"], read_scalars(run_dir)["acc/val"]
    assert [s for s, _ in expected] == list(range(EVAL_EVERY, RICH_STEPS + 1, EVAL_EVERY))
    if fault.startswith("kill_in_eval"):  # killed as the evaluation began: none was logged twice
        assert [s for s, _ in got] == [s for s, _ in expected]
    else:  # killed after step 10: step 8's evaluation, after the step-8 checkpoint, is done (and logged) again
        assert sorted({s for s, _ in got}) == [s for s, _ in expected]
    assert dict(got) == pytest.approx(dict(expected), abs=1e-6)
    if engine in EMA_ENGINES:
        ema, ema_reference = (torch.load(d / "weights" / "ema.pt", weights_only=True)["model"]
                              for d in (run_dir, reference))
        for name, tensor in ema.items():
            assert torch.allclose(tensor.float(), ema_reference[name].float(), rtol=1e-5, atol=1e-6), name


def test_a_deepspeed_run_resumes_another_runs_checkpoint_with_its_groups_and_schedule(runs, tmp_path):
    """DeepSpeed keeps the optimizer (and its groups) in its own checkpoint; the scheduler's state is ours."""
    reference = rich_of(runs, "zero1").run_dir
    checkpoint = reference / "checkpoints" / "step-00000012"  # the newest two are kept: steps 12 and 16
    out = check_ok(run_train([*args_of("zero1"), f"trainer.resume={checkpoint}"], tmp_path, timeout=600,
                             env=user_code_env()))
    assert "resumed from" in out
    [run_dir] = run_dirs(tmp_path)
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(13, RICH_STEPS + 1))
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-6), f"step {step}"
    logged, whole = group_lrs_logged(run_dir), group_lrs_logged(reference)
    assert {s: logged[s] for s in got} == {s: whole[s] for s in got}
