"""The schemas Hydra composes with, registered in its ConfigStore under `schema/`: conf/trainer/default.yaml and
conf/lr_schedule/*.yaml are their closed schemas' values (an override of a key they lack, or of the wrong type,
fails while Hydra composes); conf/optimizer/*.yaml and conf/strategy/*.yaml start from open schemas (typed defaults;
an optimizer's own keyword arguments and a user strategy's own options may be added). Importing this module
registers them: framework/cli.py does, and so must any code that composes conf/ with Hydra's compose API.

conf/config.yaml puts the open dataset schema (framework/config/dataset.py: the keys every dataset has) under
whichever dataset is chosen: a dataset config adds keys of its own for its components (root, download, ...), and
the driver refuses one that no component uses (framework/config/settings.py), as a misspelt override would be."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from framework.config import strategy_options as so
from framework.config.dataset import DatasetConfig
from framework.config.optimizer import AdamConfig, AdamWConfig, LrScheduleConfig, SGDConfig
from framework.config.trainer import TrainerConfig

GROUP = "schema"
_CLOSED = {"trainer": TrainerConfig, "lr_schedule": LrScheduleConfig}
_OPEN = {
    "dataset": DatasetConfig,
    "optimizer/sgd": SGDConfig, "optimizer/adam": AdamConfig, "optimizer/adamw": AdamWConfig,
    "strategy/single": so.SingleOptions, "strategy/dp": so.DPOptions, "strategy/ddp": so.DDPOptions,
    "strategy/fsdp": so.FSDPOptions, "strategy/deepspeed": so.DeepSpeedOptions, "strategy/horovod": so.HorovodOptions,
}


def register() -> None:
    store = ConfigStore.instance()
    for name, schema in _CLOSED.items():
        store.store(group=GROUP, name=name, node=schema)
    for path, schema in _OPEN.items():
        group, _, name = path.rpartition("/")
        store.store(group="/".join(filter(None, (GROUP, group))), name=name,
                    node=OmegaConf.structured(schema, flags={"struct": False}))


register()
