"""Test-only: a model called the HuggingFace way (keyword arguments) that returns logits and no loss."""
from torch import nn


class LogitsOnly(nn.Module):
    def __init__(self, vocab: int = 32, classes: int = 3):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, classes)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return {"logits": self.embed(input_ids)}
