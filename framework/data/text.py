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
from torch.utils.data import Dataset, Subset

from framework.config.rules import at_least, between, require
from framework.common.errors import ConfigError

DEFAULT_TEXT = Path("/usr/share/dictd/devil.dict.dz")  # dictzip: gzip with an index; dictfmt's header lines first


def read_text(path: str | None) -> str:
    source = Path(path) if path else DEFAULT_TEXT
    if not source.is_file():
        if path:
            found = "a folder, not a text file" if source.is_dir() else "no such file"
            raise ConfigError(f"dataset.path={path} is not allowed: {found}")
        raise ConfigError(f"dataset.path=null is not allowed here: the built-in text ({DEFAULT_TEXT}, Debian's "
                          "dict-devil) is not installed; apt-get install dict-devil, or set dataset.path to a text "
                          "file of yours")
    try:
        raw = gzip.decompress(source.read_bytes()) if source.suffix in (".gz", ".dz") else source.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise ConfigError(f"dataset.path={source} cannot be read as UTF-8 text ({exc})") from None
    if not text:
        raise ConfigError(f"dataset.path={source} is not allowed: the file is empty; give a UTF-8 text file")
    if source == DEFAULT_TEXT:  # dictfmt's bookkeeping lines ("00-database-...") are not the book
        text = "\n".join(line for line in text.splitlines() if not line.startswith("00-database")) + "\n"
    return text


class CharText(Dataset):
    def __init__(self, path: str | None = None, block_size: int = 128, test_fraction: float = 0.1, train: bool = True):
        self.block_size = require("dataset.block_size", block_size, at_least(2))
        require("dataset.test_fraction", test_fraction, between(0.0, 1.0, high_open=True))
        text = read_text(path)
        self.vocab = sorted(set(text))
        self.vocabulary = Vocabulary(self.vocab)
        ids = torch.tensor(self.vocabulary.encode(text), dtype=torch.long)
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

    def decode(self, ids) -> str:
        return self.vocabulary.decode(ids)

    def tensors(self):
        return self.x, self.y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


def vocabulary_of(dataset: Dataset) -> list[str] | None:
    """The tokens a dataset's ids stand for (its `vocab`: id i is vocab[i]), through subsets; None when it has none.
    Saved with the weights, so sample.py can turn a prompt into ids and ids back into text."""
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    vocab = getattr(dataset, "vocab", None)
    if isinstance(vocab, (list, tuple)) and vocab and all(isinstance(t, str) for t in vocab):
        return list(vocab)
    return None


class Vocabulary:
    """Text to token ids and back: id i stands for tokens[i] (characters, or longer pieces: the longest match wins)."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.index = {t: i for i, t in enumerate(tokens)}
        self.longest = max(len(t) for t in tokens)

    def encode(self, text: str, key: str = "text") -> list[int]:
        if self.longest == 1:  # characters: one lookup each (a whole book at dataset build)
            try:
                return [self.index[c] for c in text]
            except KeyError:
                pass  # the loop below names every unknown character
        ids, at, unknown = [], 0, []
        while at < len(text):
            size = next((n for n in range(min(self.longest, len(text) - at), 0, -1) if text[at:at + n] in self.index),
                        0)
            if size:
                ids.append(self.index[text[at:at + size]])
            else:
                unknown.append(text[at])
            at += size or 1
        if unknown:
            shown = ", ".join(repr(c) for c in sorted(set(unknown))[:10])
            raise ConfigError(f"{key}={text[:40]!r} is not allowed: {shown} not in the model's vocabulary (the "
                              f"{len(self.tokens)} tokens of its training text)")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.tokens[int(i)] for i in ids)
