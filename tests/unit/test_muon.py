"""optimizer=muon in this process: its rule's groups on the char LM's GPT and on LeNet, a param group overriding the
rule, one optimizer stepping both algorithms exactly as torch's Muon and AdamW would alone, its checkpoint, the
driver's refusals, and the char LM trained by train.py's command with it. ddp equal to one process:
tests/dist/test_muon.py."""
import copy
import math

import pytest
import torch

from framework.common.errors import ConfigError
from framework.config.optimizer import MuonConfig
from framework.models.gpt import GPT
from framework.models.lenet import LeNet
from framework.training.muon import MuonWithAdamW
from framework.training.optim import build_optimizer
from framework.training.param_groups import ParamGroups
from support.driver import command_in_process, composed, driver_says
from support.run_files import read_scalars

MATRICES = ("attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.proj.weight", "mlp.0.weight", "mlp.2.weight")


def gpt():
    torch.manual_seed(0)
    return GPT(in_shape=(16,), num_classes=11, n_layer=2, n_head=2, n_embd=8)


def muon_optimizer(model, groups=None, **settings):
    options = MuonConfig(param_groups=groups or [], **settings)
    return build_optimizer(options, model.parameters(), 1, ParamGroups.of(options, model))


def names_by_group(optimizer, model) -> dict[str, tuple[bool, set[str]]]:
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {g["name"]: (g["use_muon"], {name_of[id(p)] for p in g["params"]}) for g in optimizer.param_groups}


def test_the_rule_gives_muon_the_hidden_matrices_and_adamw_embeddings_head_norms_and_biases():
    model = gpt()
    groups = names_by_group(muon_optimizer(model), model)
    hidden = {f"blocks.{b}.{m}" for b in range(2) for m in MATRICES}
    assert groups == {"default": (True, hidden),
                      "default_adamw": (False, {n for n, _ in model.named_parameters()} - hidden)}
    # the tied head is the token embedding: AdamW's, as the embedding; no norm or position embedding steps with Muon
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "blocks.0.ln_1.weight"} <= groups["default_adamw"][1]


def test_on_a_cnn_the_output_layer_and_the_conv_kernels_go_to_adamw():
    torch.manual_seed(0)
    model = LeNet(in_shape=(1, 28, 28), num_classes=10)
    groups = names_by_group(muon_optimizer(model), model)
    assert groups["default"] == (True, {"classifier.0.weight"})  # the only hidden matrix; classifier.2 is the head
    assert "classifier.2.weight" in groups["default_adamw"][1] and "features.0.weight" in groups["default_adamw"][1]


def test_a_param_group_overrides_the_rule_and_keeps_its_settings():
    model = gpt()
    optimizer = muon_optimizer(model, [
        {"name": "first", "params": ["blocks.0.*"], "use_muon": False, "lr_scale": 0.5},
        {"name": "nodecay", "params": ["*"], "ndim_below": 2, "weight_decay": 0.0}])
    groups = names_by_group(optimizer, model)
    assert list(groups) == ["default", "default_adamw", "first", "nodecay_adamw"]  # nodecay's Muon part: empty
    assert groups["first"] == (False, {n for n, _ in model.named_parameters() if n.startswith("blocks.0.")})
    assert groups["default"][1] == {f"blocks.1.{m}" for m in MATRICES}
    settings = {g["name"]: g for g in optimizer.param_groups}
    assert settings["first"]["lr"] == pytest.approx(0.0005) and settings["nodecay_adamw"]["weight_decay"] == 0.0
    assert settings["default"]["weight_decay"] == 0.1 and "betas" in settings["first"]


@pytest.mark.parametrize("group,says", [
    ({"params": ["blocks.0.ln_1.*"], "use_muon": True},
     "optimizer.param_groups.0.use_muon=true is not allowed for blocks.0.ln_1.weight (shape [8]): torch.optim.Muon "
     "steps 2-D matrices only"),
    ({"params": ["wte.*"], "use_muon": "yes"}, "optimizer.param_groups.0.use_muon='yes' is not allowed: expected true"),
    ({"params": ["wte.*"], "name": "default_adamw"},
     "optimizer.param_groups.0.name='default_adamw' is not allowed with optimizer=muon"),
])
def test_a_group_the_rule_cannot_take_is_one_line(group, says):
    with pytest.raises(ConfigError, match="^" + says.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        muon_optimizer(gpt(), [group])


def test_one_step_is_torchs_muon_on_the_matrices_and_torchs_adamw_on_the_rest():
    """The one optimizer steps each part exactly as torch's own optimizers, built on that part alone, would."""
    model = gpt()
    twin = copy.deepcopy(model)
    optimizer = muon_optimizer(model, lr=0.01)
    hidden = [p for n, p in twin.named_parameters() if any(n.endswith(m) for m in MATRICES)]
    rest = [p for n, p in twin.named_parameters() if not any(n.endswith(m) for m in MATRICES)]
    torch_muon = torch.optim.Muon(hidden, lr=0.01, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    torch_adamw = torch.optim.AdamW(rest, lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    ids = torch.randint(0, 11, (4, 16), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        for m, opts in ((model, [optimizer]), (twin, [torch_muon, torch_adamw])):
            m(ids).square().mean().backward()
            for o in opts:
                o.step()
                o.zero_grad()
    for (name, mine), theirs in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(mine, theirs), name


def test_a_loaded_state_keeps_both_parts_stepping_as_one():
    """load_state_dict replaces the group dicts and the state: both inner optimizers see the new ones (an lr set on
    the outer group reaches the step; the momentum buffers carry on)."""
    model = gpt()
    optimizer = muon_optimizer(model)
    ids = torch.randint(0, 11, (4, 16), generator=torch.Generator().manual_seed(1))
    model(ids).square().mean().backward()
    optimizer.step()
    saved = copy.deepcopy(optimizer.state_dict())
    again = muon_optimizer(model)
    again.load_state_dict(saved)
    assert {id(g) for g in again.param_groups} == {id(g) for g in again._muon.param_groups + again._adamw.param_groups}
    assert again._muon.state is again.state and again._adamw.state is again.state
    for group in again.param_groups:
        group["lr"] = 0.0  # a schedule's write
    before = [p.detach().clone() for p in model.parameters()]
    again.step()  # lr 0: nothing moves, though both parts hold momentum
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert len(again.state) == len(list(model.parameters()))


def test_groups_without_use_muon_are_refused_by_the_optimizer_itself():
    with pytest.raises(ValueError, match="each say use_muon"):
        MuonWithAdamW(gpt().parameters())


@pytest.mark.parametrize("strategy,why", [
    ("fsdp", "each rank steps its shards of the matrices (DTensors)"),
    ("tp", "each rank steps its shards of the matrices (DTensors)"),
    ("pp", "Muon under this engine is not proven equal to one process"),
])
def test_engines_that_shard_or_are_unproven_are_refused_before_any_worker(tmp_path, strategy, why):
    says = driver_says(["experiment=char_lm", "optimizer=muon", f"strategy={strategy}"], tmp_path)
    assert says.startswith(f"optimizer=muon is not allowed with strategy={strategy}: {why}"), says
    assert says.endswith("use strategy=single, dp or ddp, or another optimizer")


def test_deepspeed_is_refused_for_its_flattened_buffers(tmp_path):
    pytest.importorskip("deepspeed")
    assert driver_says(["experiment=char_lm", "optimizer=muon", "strategy=deepspeed"], tmp_path).startswith(
        "optimizer=muon is not allowed with strategy=deepspeed: DeepSpeed hands its optimizer flattened parameter "
        "buffers")


@pytest.mark.parametrize("override,says", [
    ("optimizer.adjust_lr_fn=sqrt", "optimizer.adjust_lr_fn='sqrt' is not allowed: expected one of original, "
                                    "match_rms_adamw, spectral_unclamped"),
    ("optimizer.adamw_betas=[0.9]", "optimizer.adamw_betas=[0.9] is not allowed: expected two numbers in [0, 1)"),
    ("optimizer.momentum=1.0", "optimizer.momentum=1.0 is not allowed: expected a number in [0.0, 1.0)"),
    ("optimizer._target_=torch.optim.AdamW", "optimizer._target_=torch.optim.AdamW is not allowed with optimizer=muon"),
])
def test_bad_muon_settings_are_one_line(tmp_path, override, says):
    said = driver_says(["dataset=synthetic", "optimizer=muon", override], tmp_path)
    assert said.startswith(says), said


def test_the_preset_composes_with_its_schema():
    cfg = composed("optimizer=muon")
    assert cfg.optimizer._target_ == "framework.training.muon.MuonWithAdamW" and cfg.optimizer.ns_steps == 5


def test_the_char_lm_trains_with_muon(tmp_path, monkeypatch, capsys):
    """train.py's command, in this process (strategy=single trains in the driver's process): finite losses falling
    at every log over the first steps (4.0 to 3.0 when measured), and the two parts' lrs logged by their group
    names."""
    code, out, err = command_in_process("main", [
        "train.py", "experiment=char_lm", "optimizer=muon", "optimizer.lr=0.01", "strategy=single",
        "model.n_layer=1", "model.n_embd=32", "dataset.block_size=32", "dataset.max_test_samples=64",
        "trainer.max_steps=16", "trainer.epochs=1", "trainer.log_every_n_steps=4", "trainer.progress_bar=false",
        "trainer.batch_size=16", "trainer.keep_checkpoints=0", "lr_schedule=constant",
        f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, monkeypatch, capsys)
    assert code == 0, out + err
    scalars = read_scalars(tmp_path / "run")
    losses = [v for _, v in scalars["loss/train"]]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses), losses
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.3, losses  # from about ln(vocabulary) towards the text's statistics
    assert {"lr/default", "lr/default_adamw"} <= set(scalars)
