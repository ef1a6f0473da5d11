"""The keys every dataset config has, whatever its `train` and `test` components are (conf/dataset/*.yaml; a
user's own dataset config may leave any of them out). The rest of a dataset node is the user's: keys its
components interpolate (root, download, ...) pass through untouched."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from framework.config.rules import Checked, at_least, int_list, rule


@dataclass
class DatasetConfig(Checked):
    train: Any = None  # a component: any map-style torch Dataset giving (input, label), by _target_
    test: Any = None
    name: Optional[str] = None  # for logs and checkpoints; null: the train component's class name
    # keep the split as one tensor on the device when the dataset offers its tensors; false: DataLoader
    in_memory: bool = True
    max_train_samples: Optional[int] = rule(None, at_least(1))  # use only the first N training samples
    max_test_samples: Optional[int] = rule(None, at_least(1))
    num_classes: Optional[int] = rule(None, at_least(2))  # null: the dataset's num_classes/classes, else max label+1
    in_shape: Optional[List[int]] = rule(None, int_list(1))  # null: the dataset's in_shape, else the first sample's
    augment: Any = None  # batched on-device augmentation, e.g. {_target_: framework.data.augment.RandomCropFlip}

    @property
    def display_name(self) -> str:
        """`name` if given, else the train component's class name (logs, hparams, checkpoint signatures)."""
        if self.name:
            return self.name
        target = str((self.train or {}).get("_target_", "dataset"))
        return target.rsplit(".", 1)[-1]
