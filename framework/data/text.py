"""Character-level text for language models (experiment=char_lm): a text file cut into blocks of block_size + 1
characters; a sample's input is a block's first block_size characters and its target the same block shifted by
one (next-character prediction), both token ids [block_size]. The vocabulary is the text's characters, in order;
the text's first 1 - test_fraction is the train split and the rest the test split (contiguous, as language models
are evaluated). The whole split is two tensors, so it trains from device memory (the in-memory path).

Without `path`, The Devil's Dictionary by Ambrose Bierce (1911, public domain), from Debian's dict-devil package
(`apt-get install dict-devil`; scripts/setup.sh installs it)."""
from __future__ import annotations

import gzip
from pathlib import Path

import torch
from torch.utils.data import Dataset

from framework.config.rules import at_least, between, require
from framework.errors import ConfigError

DEFAULT_TEXT = Path("/usr/share/dictd/devil.dict.dz")  # dictzip: gzip with an index; dictfmt's header lines first


def read_text(path: str | None) -> str:
    source = Path(path) if path else DEFAULT_TEXT
    if not source.is_file():
        if path:
            raise ConfigError(f"dataset.path={path} is not allowed: no such file")
        raise ConfigError(f"dataset.path=null is not allowed here: the built-in text ({DEFAULT_TEXT}, Debian's "
                          "dict-devil) is not installed; apt-get install dict-devil, or set dataset.path to a text "
                          "file of yours")
    try:
        raw = gzip.decompress(source.read_bytes()) if source.suffix in (".gz", ".dz") else source.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ConfigError(f"dataset.path={source} cannot be read as UTF-8 text ({exc})") from None
    if source == DEFAULT_TEXT:  # dictfmt's bookkeeping lines ("00-database-...") are not the book
        text = "\n".join(line for line in text.splitlines() if not line.startswith("00-database")) + "\n"
    return text


class CharText(Dataset):
    def __init__(self, path: str | None = None, block_size: int = 128, test_fraction: float = 0.1, train: bool = True):
        self.block_size = require("dataset.block_size", block_size, at_least(2))
        require("dataset.test_fraction", test_fraction, between(0.0, 1.0, high_open=True))
        text = read_text(path)
        self.vocab = sorted(set(text))
        ids = torch.tensor(self._encode(text), dtype=torch.long)
        cut = int(len(ids) * (1 - test_fraction))
        part = ids[:cut] if train else ids[cut:]
        blocks = (len(part) - 1) // block_size
        if blocks < 1:
            raise ConfigError(f"dataset.block_size={block_size} is not allowed: the {'train' if train else 'test'} "
                              f"split of the text has only {len(part)} characters")
        windows = part[: blocks * block_size + 1]
        self.x = windows[:-1].view(blocks, block_size)
        self.y = windows[1:].view(blocks, block_size)
        self.num_classes = len(self.vocab)
        self.in_shape = (block_size,)

    def _encode(self, text: str) -> list[int]:
        index = {c: i for i, c in enumerate(self.vocab)}
        return [index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def tensors(self):
        return self.x, self.y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]
