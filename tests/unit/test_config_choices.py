"""Choices are Enums (framework/config/choices.py): OmegaConf checks them while Hydra composes, and when the driver
types a config that did not come through composition, with the same one line; everywhere else a member is the plain
string the code compares with, prints, hashes, serialises and pickles. In this process (Hydra's compose API); the one
real `python train.py` is tests/runs/test_refusals.py's."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest
import torch
from omegaconf import OmegaConf

from framework.common.errors import ConfigError
from framework.config import choices
from framework.config.choices import Accelerator, Choice, PrecisionChoice, ReduceOp
from framework.config.rules import Checked
from framework.config.settings import settings_of
from framework.config.strategy_options import DeepSpeedOptions, MeshOptions
from framework.config.trainer import TrainerConfig
from framework.config.typed import typed
from support.driver import composed, composition_says

CHOICES = [c for c in vars(choices).values() if isinstance(c, type) and issubclass(c, Choice) and c is not Choice]


BAD_CHOICES = {
    ("trainer.precision=fp8",): "trainer.precision='fp8' is not allowed: expected one of fp32, bf16, fp16",
    ("trainer.accelerator=tpu",): "trainer.accelerator='tpu' is not allowed: expected one of auto, cpu, gpu",
    ("trainer.on_nonfinite=ignore",): "trainer.on_nonfinite='ignore' is not allowed: expected one of stop, skip",
    ("lr_schedule.name=step",): "lr_schedule.name='step' is not allowed: expected one of constant, warmup_cosine, torch",
    ("optimizer.lr_scaling=sqrt",): "optimizer.lr_scaling='sqrt' is not allowed: expected one of none, linear",
    ("strategy=ddp", "strategy.backend=mpi"): "strategy.backend='mpi' is not allowed: expected one of auto, nccl, gloo",
    ("strategy=fsdp", "strategy.rdzv_backend=etcd"):
        "strategy.rdzv_backend='etcd' is not allowed: expected one of c10d, static",
    ("strategy=horovod", "strategy.compression=int8"):
        "strategy.compression='int8' is not allowed: expected one of none, fp16, bf16, powersgd",
    ("strategy=horovod", "strategy.op=max"): "strategy.op='max' is not allowed: expected one of average, sum, adasum",
}


@pytest.mark.parametrize("overrides", list(BAD_CHOICES), ids=lambda o: o[-1])
def test_a_choice_hydra_composes_is_checked_while_it_composes(overrides):
    assert composition_says(*overrides) == BAD_CHOICES[overrides]


def test_the_driver_typing_a_config_says_the_same_line():
    """A config that did not come through composition (a run's saved config, a plain mapping)."""
    with pytest.raises(ConfigError) as refused:
        typed(TrainerConfig, {"precision": "fp8"}, "trainer")
    assert str(refused.value) == BAD_CHOICES[("trainer.precision=fp8",)]
    schema = dataclasses.make_dataclass("Schema", [("op", ReduceOp, dataclasses.field(default=ReduceOp.sum))],
                                        bases=(Checked,))
    with pytest.raises(ConfigError, match=r"^strategy.op=3 is not allowed: expected one of average, sum, adasum$"):
        typed(schema, {"op": 3}, "strategy")


def test_every_choice_is_an_enum_and_each_member_is_its_plain_string():
    assert {c.__name__ for c in CHOICES} >= {"PrecisionChoice", "Accelerator", "OnNonfinite", "Schedule", "LrScaling",
                                              "Backend", "RdzvBackend", "Compression", "ReduceOp"}
    for choice in CHOICES:
        for member in choice:
            word = member.value
            assert type(word) is str and member.name == word  # OmegaConf takes a member by its name
            assert member == word and word == member and not member != word
            assert {word: 1}[member] == 1 and {member: 1}[word] == 1 and hash(member) == hash(word)
            assert str(member) == f"{member}" == "{}".format(member) == "%s" % member == word  # noqa: UP031
            assert f"{member:>8}" == f"{word:>8}" and repr(member) == repr(word)
            assert json.dumps(member) == json.dumps(word) and json.dumps({"k": member}) == json.dumps({"k": word})
            assert pickle.loads(pickle.dumps(member)) is member
            assert member in (word,) and word in {member}


def test_typed_settings_hold_the_members_and_they_travel_and_print_as_strings():
    cfg = composed("strategy=ddp", "trainer.precision=bf16", "trainer.accelerator=cpu", "trainer.on_nonfinite=skip",
                   "optimizer.lr_scaling=linear", "lr_schedule=constant", "strategy.backend=gloo")
    s = settings_of(cfg, MeshOptions)
    assert s.trainer.precision is PrecisionChoice.bf16 and s.trainer.accelerator is Accelerator.cpu
    assert (s.trainer.precision, s.trainer.on_nonfinite, s.optimizer.lr_scaling, s.lr_schedule.name,
            s.strategy.backend, s.strategy.rdzv_backend) == ("bf16", "skip", "linear", "constant", "gloo", "c10d")
    again = pickle.loads(pickle.dumps(s))  # as the workers get them
    assert again.trainer.precision is PrecisionChoice.bf16 and again.trainer.engine().precision == "bf16"
    assert OmegaConf.to_yaml(cfg.trainer).count("precision: bf16") == 1  # the run folder's .hydra/config.yaml
    saved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # framework/run.py: resolved_config.yaml
    assert "precision: bf16" in OmegaConf.to_yaml(saved) and "PrecisionChoice" not in OmegaConf.to_yaml(saved)


def test_the_code_that_compares_with_strings_gets_what_it_got_from_strings():
    """The DeepSpeed config (JSON, DeepSpeed's own dtype names looked up by trainer.precision), the lr schedule,
    and TensorBoard's hparams: the same from a member as from its string."""
    from torch.utils.tensorboard.summary import hparams

    from framework.config.optimizer import LrScheduleConfig
    from framework.strategies.deepspeed_config import generated_config
    from framework.training.lr_schedule import LrSchedule, TorchSchedule, build_lr_schedule

    for precision in PrecisionChoice:
        members = generated_config(DeepSpeedOptions(), TrainerConfig(precision=precision), 2)
        words = generated_config(DeepSpeedOptions(), TrainerConfig(precision=precision.value), 2)
        assert json.dumps(members) == json.dumps(words)
    tags = [str(hparams({"precision": p}, {"acc": 0.5})) for p in (PrecisionChoice.fp16, "fp16")]
    assert tags[0] == tags[1]
    for name in (s for s in choices.Schedule if s != "torch"):
        member, word = (LrSchedule(LrScheduleConfig(name=n), total_steps=10) for n in (name, name.value))
        assert [member.factor(i) for i in range(1, 11)] == [word.factor(i) for i in range(1, 11)]
    step_lr = {"_target_": "torch.optim.lr_scheduler.StepLR", "step_size": 2}
    for name in (choices.Schedule.torch, "torch"):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        schedule = build_lr_schedule(LrScheduleConfig(name=name, scheduler=step_lr), optimizer, total_steps=10)
        assert isinstance(schedule, TorchSchedule)
