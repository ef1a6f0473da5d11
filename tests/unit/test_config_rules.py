"""Schema rules check the value where OmegaConf has checked the type; a component's own constructor arguments (plain
Python values, which nothing typed) and a field typed Any get the type checked by the rule too. What an optimizer's
constructor refuses is its own rule, said in one line by the driver. In this process."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from framework.common.errors import ConfigError
from framework.config.rules import Checked, at_least, between, int_list, non_empty_text, require, rule
from framework.config.trainer import TrainerConfig
from framework.config.typed import typed
from support.driver import composition_says, driver_says


def test_a_components_own_argument_is_checked_for_its_type_too():
    assert require("model.n_layer", 2, at_least(1)) == 2
    for value in ("2", True, 2.0, None):
        with pytest.raises(ConfigError, match=r"^model.n_layer=.* is not allowed: expected an integer >= 1$"):
            require("model.n_layer", value, at_least(1))
    for value in ("0.5", False):
        with pytest.raises(ConfigError):
            require("model.dropout", value, between(0.0, 1.0))
    with pytest.raises(ConfigError):
        require("dataset.shape", [8, "8"], int_list(1))
    with pytest.raises(ConfigError):
        require("banner", 3, non_empty_text())


@dataclasses.dataclass
class _Loose(Checked):
    anything: Any = rule(1, at_least(1))  # typed Any: OmegaConf lets any value through, so the rule checks the type


def test_a_field_typed_any_still_has_its_type_checked_by_its_rule():
    assert typed(_Loose, {"anything": 3}, "x").anything == 3
    for value in ("3", True, 2.5):
        with pytest.raises(ConfigError, match=r"^x.anything=.* is not allowed: expected an integer >= 1$"):
            typed(_Loose, {"anything": value}, "x")


def test_a_value_of_the_wrong_type_says_the_rule():
    assert composition_says("trainer.epochs=abc") == "trainer.epochs='abc' is not allowed: expected an integer >= 1"
    assert composition_says("trainer.grad_clip=big") == ("trainer.grad_clip='big' is not allowed: expected a "
                                                         "number > 0 or null")


def test_weight_decay_may_be_any_value_torch_takes(tmp_path):
    assert driver_says(["optimizer.weight_decay=2", "dataset.max_train_samples=256"], tmp_path) == ""
    assert driver_says(["optimizer=adamw", "optimizer.weight_decay=1.5", "dataset.max_train_samples=256"],
                       tmp_path) == ""
    assert driver_says(["optimizer.weight_decay=-0.1"], tmp_path) == ("optimizer.weight_decay=-0.1 is not allowed: "
                                                                      "expected a number >= 0")


def test_what_the_optimizer_refuses_is_one_line_in_the_driver(tmp_path):
    """torch.optim.SGD's own nesterov rule (no copy of it in the schema), a keyword the optimizer does not take, and
    a class that does not exist: the driver builds the optimizer once, and says which keys it was given."""
    assert driver_says(["optimizer=sgd", "optimizer.nesterov=true", "optimizer.momentum=0.0"], tmp_path) == (
        "optimizer._target_=torch.optim.SGD refused its arguments (optimizer.lr=0.05, optimizer.momentum=0.0, "
        "optimizer.weight_decay=0.0, optimizer.nesterov=true): ValueError: Nesterov momentum requires a momentum "
        "and zero dampening")
    assert driver_says(["optimizer=adam", "+optimizer.amsgrd=true"], tmp_path).endswith(
        "optimizer.amsgrd=true): TypeError: Adam.__init__() got an unexpected keyword argument 'amsgrd'")
    assert driver_says(["optimizer._target_=torch.optim.NoSuchOptimizer"], tmp_path).startswith(
        "optimizer._target_=torch.optim.NoSuchOptimizer is not allowed: it cannot be imported (")


def test_dead_code_is_gone():
    import framework.config.rules as rules
    import framework.config.typed as typed_module

    assert not hasattr(typed_module, "options_of")
    assert rules.ConfigError is ConfigError  # imported at the top, not inside require()


def test_another_compile_backend_is_still_checked_against_torch():
    assert typed(TrainerConfig, {"compile_backend": "aot_eager"}, "trainer").compile_backend == "aot_eager"
    with pytest.raises(ConfigError, match=r"^trainer.compile_backend='inductr' is not allowed: .*list_backends"):
        typed(TrainerConfig, {"compile_backend": "inductr"}, "trainer")
