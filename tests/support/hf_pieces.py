"""The models and data users bring from HuggingFace and timm, all made locally, never downloaded: a tiny BERT and a
tiny GPT-2 (random init from BertConfig / GPT2Config), a timm ViT, and `datasets` datasets saved to disk, with a
config dir naming them (tests/unit/test_hf.py, tests/runs/test_hf.py)."""
from __future__ import annotations

from pathlib import Path

import torch

VOCAB, LENGTH = 32, 16
BERT = f"""
_target_: transformers.BertForSequenceClassification
config:
  _target_: transformers.BertConfig
  vocab_size: {VOCAB}
  hidden_size: 32
  num_hidden_layers: 2
  num_attention_heads: 2
  intermediate_size: 64
  max_position_embeddings: {LENGTH}
  num_labels: 3
"""
GPT2 = f"""
_target_: transformers.GPT2LMHeadModel
config:
  _target_: transformers.GPT2Config
  vocab_size: {VOCAB}
  n_embd: 32
  n_layer: 2
  n_head: 2
  n_positions: {LENGTH}
  bos_token_id: 0
  eos_token_id: 0
  use_cache: false
"""
CLASSES = """
train: {{_target_: datasets.load_from_disk, dataset_path: {root}/classes/train}}
test: {{_target_: datasets.load_from_disk, dataset_path: {root}/classes/test}}
"""
COUNTING = """
train: {{_target_: framework.data.hf.from_disk, path: {root}/counting, split: train, streaming: true, num_shards: 2}}
test: {{_target_: framework.data.hf.from_disk, path: {root}/counting, split: test, streaming: true, num_shards: 2}}
"""
VIT = """
_target_: timm.create_model
model_name: vit_tiny_patch16_224
num_classes: 10
img_size: 28
patch_size: 7
in_chans: 1
depth: 2
embed_dim: 32
num_heads: 2
"""


def classes(count: int, seed: int):
    """Token sequences whose class is their first token mod 3 (BERT's pooler reads the first position)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, LENGTH), generator=g)
    return {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
            "labels": (ids[:, 0] % 3).tolist()}


def counting(count: int, seed: int):
    """Sequences that count up mod the vocabulary from a random start: a language model learns them fast."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, VOCAB, (count, 1), generator=g) + torch.arange(LENGTH)) % VOCAB
    return {"input_ids": ids.tolist(), "labels": ids.tolist()}




def make_conf(root: Path) -> Path:
    """The datasets on disk under root and a config dir naming them and the tiny models; returns the config dir."""
    import datasets

    for split, (count, seed) in {"train": (256, 0), "test": (64, 1)}.items():
        datasets.Dataset.from_dict(classes(count, seed)).save_to_disk(str(root / "classes" / split))
    datasets.DatasetDict({split: datasets.Dataset.from_dict(counting(count, seed))
                          for split, (count, seed) in {"train": (256, 0), "test": (64, 1)}.items()}
                         ).save_to_disk(str(root / "counting"))
    conf = root / "conf"
    for group, name, text in [("model", "tiny_bert", BERT), ("model", "tiny_gpt2", GPT2), ("model", "tiny_vit", VIT),
                              ("dataset", "classes", CLASSES.format(root=root)),
                              ("dataset", "counting", COUNTING.format(root=root))]:
        (conf / group).mkdir(parents=True, exist_ok=True)
        (conf / group / f"{name}.yaml").write_text(text)
    return conf
