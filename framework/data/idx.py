"""Reader for the IDX format of MNIST and Fashion-MNIST (plain or .gz), without torchvision."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from framework.common.errors import ConfigError

_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _header(data: bytes, path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise ConfigError(f"dataset file {path} is not an IDX file (bad header)")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigError(f"dataset file {path} is truncated (incomplete header)")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    return shape, np.dtype(_DTYPES[data[2]]), header


def check_idx_header(path: Path) -> None:
    """Cheap check (no full decompression): the header's size must match the file's real size. For
    .gz that is the size gzip records in its last 4 bytes, which a truncated download does not have."""
    try:
        with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
            first = f.read(4 + 4 * 255)
        shape, dtype, header = _header(first, path)
        if path.suffix == ".gz":
            with open(path, "rb") as f:
                f.seek(-4, 2)
                size = struct.unpack("<I", f.read(4))[0]
        else:
            size = path.stat().st_size
    except (OSError, EOFError) as exc:
        raise ConfigError(f"dataset file {path} cannot be read ({exc}); delete it or point dataset.root elsewhere") from exc
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if size != expected % 2**32:
        raise ConfigError(f"dataset file {path} is truncated or corrupt: its header promises {expected} bytes, "
                          f"the file holds {size}; delete it or point dataset.root elsewhere")


def read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as exc:  # truncated or not gzip at all
        raise ConfigError(f"dataset file {path} cannot be read ({exc}); delete it or point dataset.root elsewhere") from exc
    shape, dtype, header = _header(data, path)
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(data) - header != expected:
        raise ConfigError(
            f"dataset file {path} is truncated or corrupt: header says shape {tuple(shape)} "
            f"({expected} bytes) but it holds {len(data) - header} bytes"
        )
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
