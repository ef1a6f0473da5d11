"""The keys every dataset config has, whatever its components are (conf/dataset/*.yaml; a user's own dataset config
may leave any of them out). A dataset config names either `train` and `test` components, or one Dataset with its
own `_target_`: split by `val_fraction`, or built twice (train=True/False) when its constructor takes `train`
(framework/data/build.py). The rest of a dataset node is the user's: keys its components interpolate (root,
download, ...), or the one Dataset's own arguments."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import dataclasses

from framework.config.foreign_keys import entry_key_hint
from framework.config.rules import Checked, SettingError, at_least, between, int_list, rule


@dataclass
class DatasetConfig(Checked):
    train: Any = None  # a component: any map-style torch Dataset giving (input, label), by _target_
    test: Any = None
    name: Optional[str] = None  # for logs and checkpoints; null: the train component's class name
    # keep the split as one tensor on the device when the dataset offers its tensors; false: DataLoader
    in_memory: bool = True
    max_train_samples: Optional[int] = rule(None, at_least(1))  # use only the first N training samples
    max_test_samples: Optional[int] = rule(None, at_least(1))
    # use only this share of a split (its first ceil(share * N) samples; with max_*_samples, the smaller); null: all
    train_share: Optional[float] = rule(None, between(0.0, 1.0, low_open=True))
    test_share: Optional[float] = rule(None, between(0.0, 1.0, low_open=True))
    num_classes: Optional[int] = rule(None, at_least(2))  # null: the dataset's num_classes/classes, else max label+1
    in_shape: Optional[List[int]] = rule(None, int_list(1))  # null: the dataset's in_shape, else the first sample's
    augment: Any = None  # batched on-device augmentation, e.g. {_target_: framework.data.augment.RandomCropFlip}
    # collate_fn(samples) -> batch for both splits, by _target_ (a split's own `collate_fn:` key goes over it)
    collate_fn: Any = None
    _target_: Optional[str] = None  # one Dataset (its arguments beside it): split by val_fraction, or by `train`
    val_fraction: Optional[float] = rule(None, between(0.0, 1.0, high_open=True))  # its share held out for testing
    split_seed: int = rule(0, at_least(0))  # the split's permutation: the same on every rank, world size, resume

    def check(self) -> None:
        if self._target_ and (self.train or self.test):
            raise SettingError("_target_", self._target_, message="{key}._target_ is not allowed beside {key}.train "
                               "and {key}.test: name either one Dataset (with val_fraction) or the two splits"
                               + entry_key_hint("dataset.train"))
        if self.val_fraction is not None and not self._target_:
            raise SettingError("val_fraction", self.val_fraction, message=f"{{key}}.val_fraction={self.val_fraction} "
                               "splits one Dataset named by {key}._target_, and this config names train and test")

    @property
    def one_dataset(self) -> dict | None:
        """The one Dataset's component node (its _target_ and its own arguments), or None."""
        if not self._target_:
            return None
        declared = {f.name for f in dataclasses.fields(self)}
        return {"_target_": self._target_, **{k: v for k, v in vars(self).items() if k not in declared}}

    @property
    def display_name(self) -> str:
        """`name` if given, else the train component's class name (logs, hparams, checkpoint signatures)."""
        if self.name:
            return self.name
        target = str(self._target_ or (self.train or {}).get("_target_", "dataset"))
        return target.rsplit(".", 1)[-1]
