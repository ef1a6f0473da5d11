"""The built-in strategies compose from closed schemas: a key one lacks fails while Hydra composes, with one line
listing the keys it has. strategy=auto (ddp's options) still resolves. A user's strategy with keys of its own starts
from the open copy of the schema it extends (examples/my_project/conf/strategy/announcing_ddp.yaml) and is typed by
its own Options in the driver, which refuses its typos. In this process; the one real `python train.py` is
tests/runs/test_refusals.py's."""
from __future__ import annotations

import pytest
import torch
from hydra.errors import ConfigCompositionException

from framework.config.settings import settings_of
from framework.config.strategy_options import MeshOptions, SingleOptions
from support.driver import composed, composition_says, driver_says, strategy_for
from support.processes import EXAMPLE


@pytest.mark.parametrize("strategy,known", [("single", "name"), ("dp", "device_ids"), ("ddp", "bucket_cap_mb"),
                                            ("fsdp", "shard_modules"), ("deepspeed", "zero_stage"),
                                            ("horovod", "backward_passes_per_step"), ("auto", "bucket_cap_mb")])
def test_a_key_a_built_in_strategy_lacks_fails_while_hydra_composes(strategy, known):
    line = composition_says(f"strategy={strategy}", "strategy.bucket_cap=30")
    assert line.startswith("Could not override 'strategy.bucket_cap': strategy has no key 'bucket_cap' (its keys: ")
    assert known in line.partition("(its keys: ")[2]


def test_strategy_auto_still_resolves_to_single_or_ddp_with_its_options():
    from framework.strategies import resolve_auto

    assert type(strategy_for("strategy=auto", "trainer.accelerator=cpu").options) is SingleOptions
    cfg = composed("strategy=auto", "strategy.nproc_per_node=3", "strategy.backend=gloo")
    assert resolve_auto(cfg, outer_kind="torch").startswith("strategy=auto chose ddp")
    options = settings_of(cfg, MeshOptions).strategy
    assert (options.name, options.nproc_per_node, options.backend) == ("ddp", 3, "gloo")


def test_a_users_strategy_with_keys_of_its_own_composes_and_its_typo_stops_in_the_driver(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    common = ["dataset=blobs", "model=mlp", "trainer.batch_size=30", "strategy=announcing_ddp"]
    says = lambda *more: driver_says([*common, *more], tmp_path, config_dir=EXAMPLE / "conf")  # noqa: E731
    assert says("strategy.banner=hi", "strategy.nproc_per_node=3") == ""  # its own key, and ddp's
    assert says("strategy.backend=mpi") == "strategy.backend='mpi' is not allowed: expected one of auto, nccl, gloo"
    typo = says("strategy.bannr=hi")
    assert typo.startswith("strategy.bannr is not allowed: strategy has no key 'bannr' (its keys: ")
    assert typo.endswith(", banner)")


def test_extending_a_closed_built_in_node_with_a_key_of_its_own_fails_while_hydra_composes(tmp_path):
    """Why examples/my_project/conf/strategy/announcing_ddp.yaml starts from /schema/open/strategy/ddp."""
    from framework.common.paths import config_dir_override

    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "mine.yaml").write_text("defaults: [ddp, _self_]\nbanner: hi\n")
    with pytest.raises(ConfigCompositionException):
        composed("strategy=mine", config_dir_override(str(tmp_path)))


def test_a_strategy_of_the_elastic_options_starts_from_their_open_copy(tmp_path):
    from framework.common.paths import config_dir_override

    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "mine.yaml").write_text("defaults: [/schema/open/strategy/elastic@_here_, _self_]\n"
                                                     "_target_: mypkg.Mine\nname: mine\nbanner: hi\n")
    node = composed("strategy=mine", "strategy.nproc_per_node=3", config_dir_override(str(tmp_path))).strategy
    assert (node.banner, node.nproc_per_node, node.backend) == ("hi", 3, "auto") and "bucket_cap_mb" not in node
    assert composition_says("strategy=mine", "strategy.backend=mpi", config_dir_override(str(tmp_path))) == \
        "strategy.backend='mpi' is not allowed: expected one of auto, nccl, gloo"


@pytest.mark.parametrize("overrides,line", [
    (["strategy=fsdp", "strategy.bucket_cap_mb=50"],
     "strategy.bucket_cap_mb=50.0 is not allowed with strategy.dp_shard=-1: it acts on the 1-D replicate mesh, where "
     "DDP itself trains (dp_replicate alone: strategy=ddp)"),
    (["strategy=hsdp", "strategy.sync_batchnorm=true"],
     "strategy.sync_batchnorm=true is not allowed with strategy.dp_replicate=2 x strategy.dp_shard=2: it acts on the "
     "1-D replicate mesh"),
    (["strategy=ddp", "strategy.cpu_offload=true"],
     "strategy.cpu_offload=true is not allowed with strategy.dp_replicate=-1: it acts where FSDP2 runs"),
    (["strategy=tp", "strategy.shard_modules=[Block]", "experiment=char_lm"],
     "strategy.shard_modules=['Block'] is not allowed with strategy.tp=2: it acts with a data-parallel degree"),
    (["strategy=fsdp", "trainer.precision=fp16"], "trainer.precision=fp16 is not allowed with strategy=fsdp"),
], ids=["ddp_key_on_fsdp", "ddp_key_on_hsdp", "fsdp_key_on_ddp", "fsdp_key_on_tp", "fp16_on_fsdp"])
def test_a_key_of_another_mesh_is_one_line_naming_it(tmp_path, overrides, line):
    said = driver_says(overrides, tmp_path)
    assert said.startswith(line) and "\n" not in said, said


def test_ddp_and_fsdp_are_presets_of_the_mesh_that_keep_their_names_and_checkpoints():
    ddp, fsdp = strategy_for("strategy=ddp"), strategy_for("strategy=fsdp")
    assert type(ddp) is type(fsdp) and type(ddp).__name__ == "MeshStrategy"
    assert (ddp.name, ddp.checkpoint_format.name, fsdp.name, fsdp.checkpoint_format.name) == ("ddp", "file", "fsdp",
                                                                                              "dcp")


@pytest.mark.parametrize("overrides,chosen", [
    (["strategy=ddp"], ("DDP", "file", True, False)),
    (["strategy=fsdp"], ("Sharded", "dcp", False, True)),
    (["strategy=hsdp"], ("Sharded", "dcp", False, True)),
    (["strategy=tp", "strategy.dp_replicate=2"], ("Sharded", "dcp", False, True)),  # never DDP beside another axis
    (["strategy=pp"], ("Sharded", "dcp", False, True)),
], ids=["ddp", "fsdp", "hsdp", "tp_with_replicas", "pp"])
def test_the_degrees_choose_the_data_parallel_once_and_the_engine_answers_from_it(overrides, chosen):
    """DDP itself only on the 1-D replicate mesh (framework/strategies/mesh/engine.py: data_parallel_for); the
    checkpoint format, gloo on GPUs and who moves the model are the chosen one's."""
    s = strategy_for(*overrides)
    assert (type(s.data_parallel).__name__, s.checkpoint_format.name, s.gloo_shares_gpus,
            s.moves_model_itself) == chosen


@pytest.mark.parametrize("old,preset,degree", [("framework.strategies.ddp.DDPStrategy", "ddp", "dp_replicate"),
                                                ("framework.strategies.fsdp.FSDPStrategy", "fsdp", "dp_shard")])
def test_a_yaml_naming_an_old_engine_class_trains_as_its_preset_and_says_what_to_write(tmp_path, old, preset, degree):
    from framework.common.paths import config_dir_override
    from framework.strategies import choose_strategy

    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "old.yaml").write_text("defaults: [/schema/open/strategy/elastic@_here_, _self_]\n"
                                                    f"_target_: {old}\nname: old_{preset}\n")
    here = config_dir_override(str(tmp_path))
    cfg = composed("strategy=old", here)
    cls, note = choose_strategy(cfg, None)
    assert cls.__name__ == "MeshStrategy" and cfg.strategy[degree] == -1
    assert note == (f"strategy._target_={old} is the old name of the mesh engine's {preset} preset: write _target_: "
                    f"framework.strategies.mesh.engine.MeshStrategy with {degree}: -1 (or start from "
                    f"conf/strategy/{preset}.yaml)")
    assert driver_says(["strategy=old"], tmp_path / "run", config_dir=tmp_path) == ""


def test_a_yaml_naming_the_mesh_by_its_old_path_trains_on_the_mesh_with_its_own_degrees(tmp_path):
    from framework.common.paths import config_dir_override
    from framework.strategies import choose_strategy

    old = "framework.strategies.model_parallel.strategy.MeshStrategy"
    (tmp_path / "strategy").mkdir()
    (tmp_path / "strategy" / "old.yaml").write_text("defaults: [/schema/strategy/tp@_here_, _self_]\n"
                                                    f"_target_: {old}\nname: old_tp\ntp: 2\n")
    cfg = composed("strategy=old", config_dir_override(str(tmp_path)))
    cls, note = choose_strategy(cfg, None)
    assert cls.__name__ == "MeshStrategy" and cfg.strategy.tp == 2 and cfg.strategy.name == "old_tp"
    assert note == (f"strategy._target_={old} is the mesh engine's old path: write _target_: "
                    "framework.strategies.mesh.engine.MeshStrategy")


def test_the_mesh_times_its_collectives_on_cpu_workers_and_on_gpus_only_when_asked():
    """A GPU's collectives overlap compute (FSDP2's prefetch): the clock, which waits for each where it starts, would
    take that away, so strategy.comm_clock=null leaves them untimed there."""
    from framework.strategies.mesh.comm_clock import timed_by_default

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert [timed_by_default(None, cpu), timed_by_default(None, gpu)] == [True, False]
    assert [timed_by_default(True, gpu), timed_by_default(False, cpu)] == [True, False]
    assert strategy_for("strategy=tp", "strategy.comm_clock=false").options.comm_clock is False
