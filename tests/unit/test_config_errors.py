"""Hydra's composition errors become the one line by their exception types (ConfigCompositionException raised from
OmegaConf's key error: an override of a key the config lacks), whatever Hydra's wording. In this process."""
from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException, OverrideParseException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from framework.cli import composition_error_line
from framework.common.errors import ConfigError, first_line, on_one_line
from framework.config.components import build_component
from framework.config.targets import TargetAllowlist, allowing
from framework.config.trainer import TrainerConfig
from support.driver import composed, composition_says


def test_an_unknown_key_is_told_by_the_exception_type_whatever_hydras_words():
    cfg = OmegaConf.create({"trainer": OmegaConf.structured(TrainerConfig)})
    with pytest.raises((ConfigKeyError, ConfigAttributeError)) as missing:
        OmegaConf.update(cfg, "trainer.epoch", 3, merge=True)
    try:
        raise ConfigCompositionException("Hydra's words, whatever they are") from missing.value
    except ConfigCompositionException as exc:
        line = composition_error_line(exc)
    assert line.startswith("Could not override 'trainer.epoch': trainer has no key 'epoch' (its keys: epochs, ")


def test_the_lines_users_get_from_composition():
    assert composition_says("trainer.epoch=3").startswith(
        "Could not override 'trainer.epoch': trainer has no key 'epoch' (its keys: epochs, max_steps, ")
    assert composition_says("model.no_such_key=1") == "Could not override 'model.no_such_key': Key 'no_such_key' " \
                                                      "is not in struct"
    assert composition_says("trainer.epochs=abc") == "trainer.epochs='abc' is not allowed: expected an integer >= 1"
    assert composition_says("model=transformer").startswith("In 'config': Could not find 'model/transformer' "
                                                            "Available options in 'model': ")


def test_a_component_whose_library_error_spans_lines_is_refused_in_one_line():
    """A training run builds what its user composed; Hydra's own blocklist refuses os.system there, in a message of
    four lines (Hydra 1.3.4), which the refusal quotes on one."""
    with allowing(TargetAllowlist(exact=frozenset({"os.system"}))), pytest.raises(ConfigError) as refused:
        build_component({"_target_": "os.system", "command": "true"}, "lr_schedule.scheduler")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("lr_schedule.scheduler._target_=os.system "), line
    assert str(ConfigError("a\n  b \n c")) == "a b c"


@pytest.mark.parametrize("override, says", [
    ("allowed_targets=[", "Could not parse the override 'allowed_targets=[': no viable alternative at input '['"),
    ("trainer.epochs=3]", "Could not parse the override 'trainer.epochs=3]': extraneous input ']' expecting <EOF>"),
])
def test_an_override_that_cannot_be_parsed_is_named_in_one_line(override, says):
    try:
        composed(override)
    except OverrideParseException as exc:
        line = composition_error_line(exc)
    assert line == f"{says} (the override grammar: https://hydra.cc/docs/advanced/override_grammar/basic)"


@pytest.mark.parametrize("text,first,whole", [
    ("shape mismatch\n  at layer fc1\n", "shape mismatch", "shape mismatch at layer fc1"),
    ("\n\n  the reason\nmore", "the reason", "the reason more"),  # a library that starts with a blank line
    ("", "", ""),
    ("  \n ", "", ""),
])
def test_a_librarys_exception_is_quoted_by_its_first_line_or_all_of_it_on_one(text, first, whole):
    assert (first_line(RuntimeError(text)), on_one_line(RuntimeError(text))) == (first, whole)
