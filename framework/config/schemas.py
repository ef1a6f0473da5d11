"""The schemas Hydra composes with, registered in its ConfigStore under `schema/`: conf/trainer/default.yaml,
conf/lr_schedule/*.yaml and conf/strategy/*.yaml are their closed schemas' values (an override of a key they lack, of
the wrong type or of a choice they do not have fails while Hydra composes, with one line: framework/cli.py);
conf/optimizer/*.yaml start from open schemas (typed defaults; an optimizer's own keyword arguments may be added).
Importing this module registers them: framework/cli.py does, and so must any code that composes conf/ with Hydra's
compose API.

A user's strategy with options of its own (a subclass of a built-in's Options, or of ElasticOptions) cannot extend
the built-in's closed node; it starts from the open copy of that schema, `schema/open/strategy/<name>` (its options,
typed, and any key besides: examples/my_project/conf/strategy/announcing_ddp.yaml). The driver types every strategy
node with its class's Options, closed (framework/config/settings.py), so a misspelt key of a user's strategy stops
there.

conf/config.yaml puts the open dataset schema (framework/config/dataset.py: the keys every dataset has) under
whichever dataset is chosen: a dataset config adds keys of its own for its components (root, download, ...), and
the driver refuses one that no component uses (framework/config/settings.py), as a misspelt override would be. The
`custom` entries of the component groups (conf/model/custom.yaml, ...) start from the open `schema/component`
(framework/config/custom_entry.py): a `_target_` and whatever arguments the user gives it."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from framework.config import strategy_options as so
from framework.config.custom_entry import CustomComponent
from framework.config.dataset import DatasetConfig
from framework.config.optimizer import AdamConfig, AdamWConfig, LrScheduleConfig, MuonConfig, SGDConfig
from framework.config.sample import SampleConfig
from framework.config.trainer import TrainerConfig
from framework.config.verify import VerifyConfig

GROUP = "schema"
OPEN = "open"  # schema/open/strategy/<name>: the open copies, for a user's strategy to extend
# the mesh's presets are MeshOptions with their degrees as defaults: what a config that leaves one out means
STRATEGIES = {"single": so.SingleOptions, "dp": so.DPOptions, "deepspeed": so.DeepSpeedOptions,
              "horovod": so.HorovodOptions, **{name: so.preset(name) for name in so.PRESETS}}
_CLOSED = {"trainer": TrainerConfig, "lr_schedule": LrScheduleConfig, "sample": SampleConfig, "verify": VerifyConfig,
           **{f"strategy/{name}": schema for name, schema in STRATEGIES.items()}}
_OPEN = {
    "dataset": DatasetConfig,
    "component": CustomComponent,  # conf/<group>/custom.yaml: a component named on the command line
    "optimizer/sgd": SGDConfig, "optimizer/adam": AdamConfig, "optimizer/adamw": AdamWConfig,
    "optimizer/muon": MuonConfig,
    # the built-in strategies' open copies, and elastic's (ElasticOptions: the launch options ddp, fsdp and deepspeed
    # share), for a user's strategy whose Options subclass ElasticOptions
    **{f"{OPEN}/strategy/{name}": schema for name, schema in {**STRATEGIES, "elastic": so.ElasticOptions}.items()},
}


def register() -> None:
    store = ConfigStore.instance()
    for path, schema in _CLOSED.items():
        group, _, name = path.rpartition("/")
        store.store(group="/".join(filter(None, (GROUP, group))), name=name, node=schema)
    for path, schema in _OPEN.items():
        group, _, name = path.rpartition("/")
        store.store(group="/".join(filter(None, (GROUP, group))), name=name,
                    node=OmegaConf.structured(schema, flags={"struct": False}))


register()


NO_DEFAULT = object()


def schema_default(config: dict, dotted: str):
    """The default the schemas give `dotted`, a key of a resolved config (its strategy's schema by the config's
    strategy.name), or NO_DEFAULT where no built-in schema declares one: what a config written before the key existed
    meant by leaving it out."""
    section, _, key = dotted.partition(".")
    if section == "strategy":
        schema = STRATEGIES.get((config.get("strategy") or {}).get("name"))
    else:
        schema = _CLOSED.get(section) or _OPEN.get(section)
    if schema is None or not key:
        return NO_DEFAULT
    return OmegaConf.select(OmegaConf.structured(schema), key, default=NO_DEFAULT)
