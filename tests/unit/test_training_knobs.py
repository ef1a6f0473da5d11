"""Training knobs, in process: optimizer.param_groups (the plan, named on the plain model under every wrapper, the
optimizer it builds, the driver's refusals), torch's lr schedulers (stepped as torch's own loop steps them, their
state carried across a resume), the lr of every group as logged tags, weights/*.safetensors, and the target allowlist
(a run folder's config is data: a package it names is refused before it is imported, unless allowed_targets names
it). tests/test_training_knobs_runs.py runs the same through real runs of every engine."""
import json
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import nn

from framework.checkpoints.weights import find_weights, read_weights, write_weights
from framework.common.errors import ConfigError
from framework.config.hydra_versions import version_base
from framework.config.optimizer import LrScheduleConfig, SGDConfig
from framework.config.targets import TargetAllowlist, allowing, current
from framework.models.build import build_model
from framework.models.gpt import GPT
from framework.models.lenet import LeNet
from framework.results.trained_model import load_model
from framework.run import RESOLVED_CONFIG
from framework.telemetry.scalars import lr_scalars
from framework.training.lr_schedule import build_lr_schedule
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups, group_lrs, group_settings
from support.driver import composed, driver_says
from support.processes import REPO

# LeNet's parameters: features.{0,3}.{weight,bias}, classifier.{0,2}.{weight,bias}
TWO_GROUPS = [{"params": ["*.bias"], "weight_decay": 0.0, "name": "no_decay"},
              {"params": ["classifier.*"], "lr_scale": 0.1, "name": "head"}]


def lenet():
    torch.manual_seed(0)
    return LeNet(in_shape=(1, 28, 28), num_classes=10)


def sgd(groups=None, lr=0.1, **kwargs) -> SGDConfig:
    return SGDConfig(lr=lr, momentum=0.9, weight_decay=0.01, param_groups=groups or [], **kwargs)


def names_by_group(optimizer, model) -> dict[str, set[str]]:
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: {name_of[id(p)] for p in g["params"]} for g in optimizer.param_groups}


# ---- optimizer.param_groups ---------------------------------------------------------------------------------------
def test_each_parameter_goes_to_the_first_group_that_matches_and_the_rest_to_the_default_group_first():
    model = lenet()
    options = sgd(TWO_GROUPS)
    optimizer = build_optimizer(options, model.parameters(), 1, ParamGroups.of(options, model))
    groups = names_by_group(optimizer, model)
    assert list(groups) == ["default", "no_decay", "head"]
    assert groups["default"] == {"features.0.weight", "features.3.weight"}
    assert groups["no_decay"] == {n for n, _ in model.named_parameters() if n.endswith(".bias")}
    # the classifier's biases went to no_decay, the first group that matched them
    assert groups["head"] == {"classifier.0.weight", "classifier.2.weight"}
    settings = [(g["lr"], g["weight_decay"], g["lr_scale"]) for g in optimizer.param_groups]
    assert settings == [(0.1, 0.01, 1.0), (0.1, 0.0, 1.0), (pytest.approx(0.01), 0.01, 0.1)]


def test_lr_scale_multiplies_the_scaled_lr_and_a_group_taking_everything_left_empties_the_default_group():
    model = lenet()
    options = sgd([{"params": ["classifier.*"], "lr_scale": 0.0, "name": "frozen"},
                   {"params": ["*"], "lr_scale": 0.5, "name": "rest"}], lr_scaling="linear")
    optimizer = build_optimizer(options, model.parameters(), 4, ParamGroups.of(options, model))
    assert [g["name"] for g in optimizer.param_groups] == ["frozen", "rest"]  # no parameter left for the default
    assert [g["lr"] for g in optimizer.param_groups] == [0.0, pytest.approx(0.1 * 4 * 0.5)]
    assert group_lrs(optimizer) == {"frozen": 0.0, "rest": pytest.approx(0.2)}
    settings = group_settings(optimizer)
    assert settings[0]["lr_scale"] == 0.0 and "params" not in settings[0]
    json.dumps(settings)  # what a checkpoint's manifest records


def test_nanogpts_rule_takes_parameters_with_fewer_than_two_dimensions():
    model = lenet()
    options = sgd([{"params": ["*"], "ndim_below": 2, "weight_decay": 0.0, "name": "no_decay"}])
    optimizer = build_optimizer(options, model.parameters(), 1, ParamGroups.of(options, model))
    assert names_by_group(optimizer, model)["no_decay"] == {n for n, p in model.named_parameters() if p.ndim < 2}


@pytest.mark.parametrize("groups, says", [
    ([{"params": ["backbone.*"]}], "optimizer.param_groups.0.params pattern 'backbone.*' is not allowed: it matches "
                                   "no parameter of LeNet (its parameters: features.0.weight, features.0.bias"),
    ([{"params": ["*.bias"]}, {"params": ["classifier.2.bias"]}],
     "optimizer.param_groups.1 (group1) is not allowed: its patterns ['classifier.2.bias'] give it no parameter "
     "(each one they match is taken by an earlier group (the first match wins))"),
    ([{"params": ["*.bias"], "lr": 0.01}], "optimizer.param_groups.0.lr=0.01 is not allowed: give lr_scale"),
    ([{"params": ["*.bias"], "lr_scale": -1}], "optimizer.param_groups.0.lr_scale=-1 is not allowed: expected a "
                                               "number >= 0"),
    ([{"params": []}], "optimizer.param_groups.0.params=[] is not allowed: expected a non-empty list"),
    ([{"params": ["*.bias"], "name": "default"}], "optimizer.param_groups.0.name='default' is not allowed"),
])
def test_a_plan_that_cannot_work_is_one_line_naming_the_key(groups, says):
    with pytest.raises(ConfigError) as error:
        ParamGroups(groups, lenet())
    assert str(error.value).startswith(says) and "\n" not in str(error.value)


@pytest.mark.parametrize("group, says", [
    ({"weight_decya": 0.0}, "optimizer.param_groups.0.weight_decya is not allowed: torch.optim.SGD has no setting "
                            "'weight_decya' (its settings: momentum, dampening, weight_decay, nesterov"),
    ({"weight_decay": "0"}, "optimizer.param_groups.0.weight_decay='0' is not allowed: torch.optim.SGD's "
                            "weight_decay is 0.01 by default; give a value of that kind"),
])
def test_a_group_setting_the_optimizer_does_not_have_is_refused(group, says):
    model = lenet()
    options = sgd([{"params": ["*.bias"], **group}])
    with pytest.raises(ConfigError) as error:
        build_optimizer(options, model.parameters(), 1, ParamGroups.of(options, model))
    assert str(error.value).startswith(says)


def test_the_driver_refuses_a_pattern_that_matches_nothing_before_any_worker(tmp_path):
    says = driver_says(["dataset=synthetic", "optimizer.param_groups=[{params:[backbone.*],lr_scale:0.1}]"], tmp_path)
    assert says.startswith("optimizer.param_groups.0.params pattern 'backbone.*' is not allowed: it matches no "
                           "parameter of LeNet")


def _single_process_group(tmp_path):
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    return dist


@pytest.mark.parametrize("wrap", ["compile", "ddp", "fsdp"])
def test_groups_are_named_by_the_plain_models_names_under_every_wrapper(tmp_path, wrap):
    """The plan is made on the plain model; what an engine hands its optimizer is named back: DDP's and compile's
    wrappers keep the parameters themselves (`module.` and `_orig_mod.` never show), fully_shard replaces each in
    place by its sharded DTensor (named by position and shape)."""
    model = lenet()
    options = sgd(TWO_GROUPS)
    plan = ParamGroups.of(options, model)
    expected = names_by_group(build_optimizer(options, model.parameters(), 1, plan), model)
    if wrap == "compile":
        wrapped = torch.compile(model)  # an OptimizedModule: names under _orig_mod.
        assert all(n.startswith("_orig_mod.") for n, _ in wrapped.named_parameters())
    else:
        dist = _single_process_group(tmp_path)
        try:
            if wrap == "ddp":
                wrapped = nn.parallel.DistributedDataParallel(model)
            else:
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.fsdp import fully_shard
                mesh = init_device_mesh("cpu", (1,))
                fully_shard(model.features, mesh=mesh)
                wrapped = fully_shard(model, mesh=mesh)
            optimizer = build_optimizer(options, wrapped.parameters(), 1, plan)
        finally:
            dist.destroy_process_group()
    if wrap == "compile":
        optimizer = build_optimizer(options, wrapped.parameters(), 1, plan)
    shapes = {n: tuple(p.shape) for n, p in lenet().named_parameters()}
    for group in optimizer.param_groups:
        assert sorted(tuple(p.shape) for p in group["params"]) == sorted(shapes[n] for n in expected[group["name"]])
    if wrap == "fsdp":  # replaced in place: none of the plain model's own objects
        assert type(optimizer.param_groups[0]["params"][0]).__name__ in ("DTensor", "Parameter")


# ---- torch's lr schedulers ----------------------------------------------------------------------------------------
def _optimizer(scales=(1.0, 0.1, 0.0), lr=0.1):
    params = [nn.Parameter(torch.zeros(2)) for _ in scales]
    return torch.optim.SGD([{"params": [p], "lr": lr * s, "lr_scale": s, "name": f"g{i}"}
                            for i, (p, s) in enumerate(zip(params, scales))], lr=lr, momentum=0.9)


def _schedule(scheduler: dict, optimizer, total_steps=20, higher_is_better=False):
    return build_lr_schedule(LrScheduleConfig(name="torch", scheduler=scheduler), optimizer, total_steps,
                             higher_is_better)


def flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def _lrs_by_loop(schedule, optimizer, steps, values=None):
    """The lr every group trains step s with, as the loop applies the schedule (before each optimizer step), with
    an evaluation giving values[s] after step s where given."""
    seen = []
    for step in range(1, steps + 1):
        schedule.apply(optimizer, step)
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        if values and step in values:
            schedule.evaluated(values[step])
    return seen


def _lrs_by_hand(scheduler, optimizer, steps, values=None):
    """torch's own loop: optimizer.step(), then scheduler.step() (on the value, for ReduceLROnPlateau)."""
    seen = []
    for step in range(1, steps + 1):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        if values is None:
            scheduler.step()
        elif step in values:
            scheduler.step(values[step])
    return seen


def test_step_lr_gives_every_group_torchs_own_curve():
    optimizer = _optimizer()
    ours = _lrs_by_loop(_schedule({"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 3, "gamma": 0.5},
                                  optimizer), optimizer, 10)
    reference = _optimizer()
    by_hand = _lrs_by_hand(torch.optim.lr_scheduler.StepLR(reference, step_size=3, gamma=0.5), reference, 10)
    assert flat(ours) == pytest.approx(flat(by_hand)) and ours[3] == pytest.approx([0.05, 0.005, 0.0])


def test_one_cycle_takes_the_runs_steps_and_a_max_lr_per_group():
    optimizer = _optimizer()
    schedule = _schedule({"_target_": "torch.optim.lr_scheduler.OneCycleLR", "max_lr": 0.4}, optimizer, total_steps=12)
    assert schedule.scheduler.total_steps == 12
    ours = _lrs_by_loop(schedule, optimizer, 12)
    reference = _optimizer()
    by_hand = _lrs_by_hand(torch.optim.lr_scheduler.OneCycleLR(reference, max_lr=[0.4, 0.04, 0.0], total_steps=12),
                           reference, 12)
    assert flat(ours) == pytest.approx(flat(by_hand))


def test_reduce_on_plateau_is_stepped_on_each_evaluation_in_the_objectives_direction():
    optimizer = _optimizer()
    node = {"_target_": "torch.optim.lr_scheduler.ReduceLROnPlateau", "factor": 0.5, "patience": 0}
    schedule = _schedule(node, optimizer, higher_is_better=True)
    assert schedule.scheduler.mode == "max"
    accuracy = {2: 0.5, 4: 0.6, 6: 0.55, 8: 0.55, 10: 0.7}
    ours = _lrs_by_loop(schedule, optimizer, 11, accuracy)
    reference = _optimizer()
    by_hand = _lrs_by_hand(torch.optim.lr_scheduler.ReduceLROnPlateau(reference, mode="max", factor=0.5, patience=0),
                           reference, 11, accuracy)
    assert flat(ours) == pytest.approx(flat(by_hand)) and ours[-1][0] == pytest.approx(0.025)
    with pytest.raises(ConfigError, match=r"lr_schedule.scheduler.mode=min is not allowed: trainer.objective is "
                                          r"higher-is-better; use mode=max"):
        _schedule({**node, "mode": "min"}, _optimizer(), higher_is_better=True)


@pytest.mark.parametrize("scheduler", [
    {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 3, "gamma": 0.5},
    {"_target_": "torch.optim.lr_scheduler.OneCycleLR", "max_lr": 0.4},
    {"_target_": "torch.optim.lr_scheduler.ReduceLROnPlateau", "factor": 0.5, "patience": 0},
])
def test_a_resumed_schedule_continues_the_same_curve(scheduler):
    """The state saved after step 5 (as a checkpoint keeps it), loaded into a new optimizer and scheduler whose groups
    an engine's checkpoint may have left at any lr: steps 6.. get the uninterrupted run's lrs."""
    values = {2: 1.0, 4: 1.1, 6: 0.9, 8: 0.95, 10: 0.95}
    optimizer = _optimizer()
    schedule = _schedule(scheduler, optimizer)
    whole = _lrs_by_loop(schedule, optimizer, 12, values)
    first = _optimizer()
    interrupted = _schedule(scheduler, first)
    _lrs_by_loop(interrupted, first, 5, values)
    saved = interrupted.state_dict()
    again = _optimizer()
    for group in again.param_groups:
        group["lr"] = 123.0  # whatever the optimizer's own state brought
    resumed = _schedule(scheduler, again)
    resumed.load_state_dict(saved)
    rest = []
    for step in range(6, 13):
        resumed.apply(again, step)
        rest.append([g["lr"] for g in again.param_groups])
        again.step()
        if step in values:
            resumed.evaluated(values[step])
    assert flat(rest) == pytest.approx(flat(whole[5:]))


@pytest.mark.parametrize("scheduler, says", [
    ({"_target_": "torch.optim.SGD"}, "lr_schedule.scheduler._target_=torch.optim.SGD is not allowed: it is not a "
                                      "torch.optim.lr_scheduler class"),
    ({"_target_": "torch.optim.lr_scheduler.StepLR"}, "lr_schedule.scheduler._target_=torch.optim.lr_scheduler.StepLR "
                                                      "refused its arguments (no arguments): TypeError"),
])
def test_a_scheduler_torch_refuses_is_one_line(scheduler, says):
    with pytest.raises(ConfigError) as error:
        _schedule(scheduler, _optimizer())
    assert str(error.value).startswith(says)


def test_one_cycle_on_a_run_of_unknown_length_says_what_it_misses():
    """A stream without trainer.max_steps: OneCycleLR gets no total_steps from the run, and the line says which key
    gives it."""
    with pytest.raises(ConfigError) as error:
        _schedule({"_target_": "torch.optim.lr_scheduler.OneCycleLR", "max_lr": 0.4}, _optimizer(), total_steps=None)
    assert str(error.value).endswith("; this run's length is unknown (a stream): give trainer.max_steps, or "
                                     "lr_schedule.scheduler.total_steps"), error.value


def test_the_driver_refuses_lr_schedule_torch_without_a_scheduler(tmp_path):
    assert driver_says(["dataset=synthetic", "lr_schedule=torch"], tmp_path).startswith(
        "lr_schedule.scheduler is missing: lr_schedule=torch names a torch.optim.lr_scheduler class by _target_")
    assert driver_says(["dataset=synthetic", "lr_schedule=step", "+lr_schedule.scheduler.size=3"], tmp_path).startswith(
        "lr_schedule.scheduler._target_=torch.optim.lr_scheduler.StepLR refused its arguments "
        "(lr_schedule.scheduler.step_size=100, lr_schedule.scheduler.gamma=0.5, lr_schedule.scheduler.size=3): "
        "TypeError")


def test_the_presets_compose():
    for preset in ("step", "one_cycle", "plateau"):
        node = composed(f"lr_schedule={preset}").lr_schedule
        assert node.name == "torch" and node.scheduler._target_.startswith("torch.optim.lr_scheduler.")
    cfg = composed("optimizer=adamw", "+optimizer/param_groups=no_decay")
    assert cfg.optimizer._target_ == "torch.optim.AdamW" and cfg.optimizer.param_groups[0].ndim_below == 2
    assert composed("model=resnet18", "+optimizer/param_groups=backbone").optimizer.param_groups[1].lr_scale == 0.1


def test_every_groups_lr_is_a_tag_of_its_own_and_lr_stays_the_first_groups():
    assert lr_scalars({"default": 0.1, "head": 0.01}) == {"lr": 0.1, "lr/default": 0.1, "lr/head": 0.01}
    assert lr_scalars({"default": 0.1}) == {"lr": 0.1}
    assert lr_scalars(0.3) == {"lr": 0.3}


# ---- safetensors --------------------------------------------------------------------------------------------------
def test_weights_are_also_safetensors_with_the_models_keys_and_what_rebuilds_it(tmp_path):
    torch.manual_seed(0)
    model = GPT(in_shape=(8,), num_classes=11, n_layer=1, n_head=2, n_embd=16)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    pointers = [v.data_ptr() for v in state.values()]
    assert len(set(pointers)) < len(pointers)  # the embedding and the head share one tensor
    conv = torch.randn(4, 3, 3, 3).contiguous(memory_format=torch.channels_last)  # strided, as channels_last is
    record = {"model_config": {"_target_": "framework.models.gpt.GPT"}, "in_shape": (8,), "num_classes": None,
              "vocab": list("abc")}
    path = write_weights(tmp_path, "best", {**state, "conv": conv}, record, 7, {"name": "loss", "value": 1.5})
    tensors = load_file(path.with_suffix(".safetensors"))
    assert set(tensors) == set(state) | {"conv"}
    assert all(torch.equal(tensors[k], v) for k, v in {**state, "conv": conv}.items())
    pt, st = read_weights(path), read_weights(path.with_suffix(".safetensors"))
    assert all(torch.equal(pt["model"][k], st["model"][k]) for k in pt["model"])
    assert {k: st[k] for k in st if k != "model"} == {k: pt[k] for k in pt if k != "model"}
    from safetensors import safe_open
    with safe_open(str(path.with_suffix(".safetensors")), "pt") as f:
        assert f.metadata()["model_target"] == "framework.models.gpt.GPT"
        assert json.loads(f.metadata()["in_shape"]) == [8]


def test_load_model_reads_the_safetensors(tmp_path):
    model = lenet()
    config = {"_target_": "framework.models.lenet.LeNet"}
    record = {"model_config": config, "in_shape": (1, 28, 28), "num_classes": 10}
    write_weights(tmp_path, "last", model.state_dict(), record, 3, {"name": "loss", "value": 1.0})
    (tmp_path / "weights" / "last.pt").unlink()  # only the safetensors: no pickle at all
    loaded = load_model(tmp_path, which="last")
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))


def test_a_run_folders_weights_are_found_by_name_first_then_safetensors_before_pt(tmp_path):
    """eval.py, sample.py and load_model find a run's weights file the same way (framework/checkpoints/weights.py)."""
    record = {"model_config": {"_target_": "framework.models.lenet.LeNet"}, "in_shape": (1, 28, 28), "num_classes": 10}
    assert find_weights(tmp_path, ("best", "last")) is None
    write_weights(tmp_path, "last", lenet().state_dict(), record, 3, {"name": "loss", "value": 1.0})
    assert find_weights(tmp_path, ("best", "last")) == tmp_path / "weights" / "last.safetensors"
    write_weights(tmp_path, "best", lenet().state_dict(), record, 2, {"name": "loss", "value": 0.5})
    (tmp_path / "weights" / "best.safetensors").unlink()
    assert find_weights(tmp_path, ("best", "last")) == tmp_path / "weights" / "best.pt"
    assert find_weights(tmp_path, ("last",)) == tmp_path / "weights" / "last.safetensors"


# ---- the target allowlist -----------------------------------------------------------------------------------------
@pytest.fixture
def outside_package(tmp_path, monkeypatch):
    """A package no allowlist names, whose import writes a marker file: if the marker exists, its code ran."""
    package = tmp_path / "pkgs" / "strangers"
    package.mkdir(parents=True)
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(textwrap.dedent(f"""\
        from pathlib import Path
        Path({str(marker)!r}).write_text("its code ran")
        from framework.models.lenet import LeNet as Net
        """))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    yield marker
    sys.modules.pop("strangers", None)


def test_a_target_outside_the_allowlist_is_refused_before_it_is_imported(outside_package):
    node = {"_target_": "strangers.Net", "in_shape": [1, 28, 28], "num_classes": 10}
    with pytest.raises(ConfigError) as error:
        build_model(node, (1, 28, 28), 10)
    assert str(error.value) == (
        "model._target_=strangers.Net is not allowed: outside allowed_targets (the framework's, torch's, "
        "torchvision's, torchmetrics' and the engines' targets, plus allowed_targets=[none]); if you trust it, allow "
        "its package: allowed_targets=[strangers.*]")
    assert not outside_package.exists() and "strangers" not in sys.modules
    with allowing(TargetAllowlist().extended(["strangers.*"])):
        assert isinstance(build_model(node, (1, 28, 28), 10), LeNet)
    assert outside_package.exists()


@pytest.mark.parametrize("target, why", [
    ("torch.load", "torch.load is not allowed"),  # torch's, but it unpickles whatever file it is given
    ("torch.os.system", "torch.os.system (it is posix.system) is not allowed"),  # an allowed name, another thing
    ("builtins.eval", "builtins.eval is not allowed"),
])
def test_names_that_would_run_code_are_refused_inside_allowed_packages_too(target, why):
    with pytest.raises(ConfigError, match=f"^loss._target_={why.replace('.', '[.]').replace('(', '[(]').replace(')', '[)]')}"):
        current().check({"_target_": target}, "loss")


def test_allowed_targets_patterns_and_a_training_runs_own_targets():
    cfg = {"model": {"_target_": "strangers.Net"}, "allowed_targets": ["mine.*", "theirs.models.Net"],
           "hydra": {"callbacks": {"x": {"_target_": "elsewhere.Callback"}}}}
    allowlist = TargetAllowlist.of_command(cfg)
    assert allowlist.allows("strangers.Net") and not allowlist.allows("strangers.Other")  # composed: exactly
    assert allowlist.allows("mine.a.B") and allowlist.allows("theirs.models.Net")
    assert not allowlist.allows("theirs.models.Other") and not allowlist.allows("elsewhere.Callback")  # Hydra's own
    assert not allowlist.allows("minefield.X")
    for bad in ("mine*", "*", "mine.*.x", "my pkg.*"):
        with pytest.raises(ConfigError, match=r"^allowed_targets.0=.* is not allowed: expected a dotted name"):
            TargetAllowlist.of_command({"allowed_targets": [bad]})
    with pytest.raises(ConfigError, match=r"^allowed_targets='mine.\*' is not allowed: expected a list"):
        TargetAllowlist.of_command({"allowed_targets": "mine.*"})


def test_hydra_gets_the_same_list_as_its_execution_whitelist_where_it_has_one():
    import hydra.utils

    whitelist = TargetAllowlist(("mine.*",), frozenset({"a.B"})).hydra_whitelist()
    if not hasattr(hydra.utils, "execution_whitelist"):  # Hydra 1.3
        assert whitelist is None
        return
    assert set(whitelist.whitelist) >= {"mine.*", "a.B", "torch.*", "framework.models.*"} and whitelist.reset


def _run_folder(tmp_path, model_target: str) -> Path:
    """A run folder as train.py leaves one (its resolved config, weights/best.*), naming `model_target`."""
    run = tmp_path / "shared_run"
    cfg = composed("dataset=synthetic", "dataset.train_size=64", "dataset.test_size=32", "trainer.accelerator=cpu")
    plain = OmegaConf.to_container(cfg, resolve=True)
    plain["model"] = {"_target_": model_target}
    run.mkdir()
    OmegaConf.save(OmegaConf.create(plain), run / RESOLVED_CONFIG)
    record = {"model_config": plain["model"], "in_shape": (1, 28, 28), "num_classes": 10}
    write_weights(run, "best", lenet().state_dict(), record, 1, {"name": "loss", "value": 1.0})
    return run


def _eval(ckpt, tmp_path, *overrides):
    from framework.evaluate import _evaluate

    out = tmp_path / f"eval{len(list(tmp_path.glob('eval*')))}"
    out.mkdir()
    given = [f"ckpt_path={ckpt}", "strategy=single", "trainer.accelerator=cpu", *overrides]
    with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()):
        cfg = compose("eval", overrides=given)
    return _evaluate(cfg, out, given, None)  # a direct run: nobody started this process as one of several


def test_eval_and_load_model_refuse_a_run_folders_target_outside_the_allowlist(tmp_path, outside_package):
    """eval.py and load_model on a run folder whose model is a package this command does not allow: refused in one
    line naming the target and allowed_targets, and its code never runs; allowed_targets naming the package runs it."""
    run = _run_folder(tmp_path, "strangers.Net")
    with pytest.raises(ConfigError, match=r"^model._target_=strangers.Net is not allowed: outside allowed_targets"):
        _eval(run, tmp_path)
    with pytest.raises(ConfigError, match=r"^model._target_=strangers.Net is not allowed: .*allowed_targets=\[none\]"):
        load_model(run)
    assert not outside_package.exists() and "strangers" not in sys.modules
    assert isinstance(load_model(run, allowed_targets=["strangers.*"]), LeNet)
    assert outside_package.exists()
    outside_package.unlink()
    sys.modules.pop("strangers", None)
    loss = _eval(run, tmp_path, "allowed_targets=[strangers.*]")
    assert outside_package.exists() and loss == loss  # it ran, and evaluated


def test_a_training_run_trusts_the_targets_its_user_composed(tmp_path, outside_package):
    says = driver_says(["dataset=synthetic", "model._target_=strangers.Net"], tmp_path)
    assert not says.startswith("model._target_=strangers.Net is not allowed"), says
