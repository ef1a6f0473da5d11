"""Hydra's composition errors become the one line by their exception types (ConfigCompositionException raised from
OmegaConf's key error: an override of a key the config lacks), whatever Hydra's wording. In this process."""
from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError

from framework.cli import composition_error_line
from framework.config.trainer import TrainerConfig
from test_config_choices import composition_says


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
