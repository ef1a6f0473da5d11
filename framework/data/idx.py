"""Reader for the IDX format of MNIST and Fashion-MNIST (plain or .gz), without torchvision."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from framework.errors import ConfigError

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:  # truncated or not gzip at all
        raise ConfigError(f"dataset file {path} cannot be read ({exc}); delete it or point dataset.root elsewhere") from exc
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise ConfigError(f"dataset file {path} is not an IDX file (bad header)")
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = np.dtype(_DTYPES[data[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise ConfigError(
            f"dataset file {path} is truncated or corrupt: header says shape {tuple(shape)} "
            f"({expected} bytes) but it holds {len(data) - header} bytes"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
