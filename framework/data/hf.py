"""HuggingFace `datasets` saved to disk, as a split's component (the hf extra):

    train: {_target_: framework.data.hf.from_disk, path: data/my_set, split: train}                 # Arrow, map-style
    train: {_target_: framework.data.hf.from_disk, path: data/my_set, split: train, streaming: true,
            num_shards: 4}                                                                          # its stream

`datasets.load_from_disk` and `datasets.load_dataset` (local files, `streaming: true` too) work by `_target_` as they
are; this adds the split of a saved DatasetDict and the IterableDataset form of a saved Dataset. Either comes in
torch's format (framework/data/build.py: with_format("torch") where no format was set); a stream is split over the
ranks by `datasets.distributed.split_dataset_by_node` and over DataLoader workers by `datasets` itself, in whole
shards where their count allows (framework/data/streams.py)."""
from __future__ import annotations

from framework.config.extras import import_extra
from framework.common.errors import ConfigError


def from_disk(path: str, split: str | None = None, streaming: bool = False, num_shards: int = 1):
    datasets = import_extra("datasets")
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise ConfigError(f"split={split!r} is not allowed for {path}: it holds the splits "
                              f"{', '.join(loaded)}; name one")
        loaded = loaded[split]
    elif split is not None:
        raise ConfigError(f"split={split!r} is not allowed for {path}: it holds one dataset, not splits; leave "
                          "split out")
    return loaded.to_iterable_dataset(num_shards=num_shards) if streaming else loaded
