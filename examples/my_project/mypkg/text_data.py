"""HuggingFace `datasets` made locally (no download): token sequences whose class is their first token mod 3, as
rows {input_ids, attention_mask, labels}: what a transformers model takes as keyword arguments (step=model_loss).
The framework gives them in torch's format."""


def token_classes(train: bool = True, size: int = 512, vocab: int = 32, length: int = 16):
    import datasets  # the hf extra: pip install 'hydra-dist[hf]'
    import torch

    g = torch.Generator().manual_seed(0 if train else 1)
    ids = torch.randint(1, vocab, (size, length), generator=g)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
                                       "labels": (ids[:, 0] % 3).tolist()})
