"""A dataset config's own key that no component uses is refused by the driver; whether a key is used is OmegaConf's
own answer (the config no longer resolves without it), not a search of the YAML text. In this process."""
from __future__ import annotations

import pytest

from framework.common.errors import ConfigError
from framework.config.settings import settings_of
from framework.config.strategy_options import SingleOptions
from support.driver import composed, driver_says


def test_a_dataset_key_is_used_only_when_an_interpolation_needs_it(tmp_path):
    unused = ("dataset.grad_accum is not allowed: the dataset config has no key 'grad_accum' and none of its "
              "components uses it")
    # an interpolation that merely contains the key's name (trainer.grad_accum) does not use dataset.grad_accum
    assert driver_says(["+dataset.grad_accum=2", "+dataset.train.block=${trainer.grad_accum}"],
                       tmp_path).startswith(unused)
    with pytest.raises(ConfigError, match="dataset.colour is not allowed"):
        settings_of(composed("strategy=single", "+dataset.colour=red"), SingleOptions)
    # used: by an absolute interpolation, by a relative one, inside a string
    for uses in (["+dataset.train.where=${dataset.place}"], ["+dataset.train.where=${..place}"],
                 ["+dataset.train.where=/data/${dataset.place}/x"]):
        settings_of(composed("strategy=single", "+dataset.place=here", *uses), SingleOptions)
    # conf/dataset/mnist.yaml: its splits' root is ${dataset.root}
    settings = settings_of(composed("strategy=single", "dataset=mnist", "dataset.root=/x"), SingleOptions)
    assert settings.dataset.train["root"] == "/x"
