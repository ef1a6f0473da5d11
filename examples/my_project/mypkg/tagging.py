"""Variable-length data: token sequences of 2 to 16 tokens, one tag per token. The samples differ in length, so the
dataset config names a collate_fn (PadTags) that pads the tokens with 0 and the tags with -100, the id torch's
cross-entropy (and the Accuracy metric) ignores: padding neither trains the model nor counts in its accuracy."""
import torch
from torch import nn
from torch.utils.data import Dataset
from torch.nn.utils.rnn import pad_sequence

PAD_TOKEN, PAD_TAG = 0, -100


class Tagging(Dataset):
    """(tokens [L], tags [L]) with L in 2..max_len; a token's tag is its id mod 3 (tokens are 1..vocab-1)."""

    def __init__(self, train: bool = True, size: int = 512, vocab: int = 32, max_len: int = 16):
        g = torch.Generator().manual_seed(0 if train else 1)
        lengths = torch.randint(2, max_len + 1, (size,), generator=g).tolist()
        self.tokens = [torch.randint(1, vocab, (n,), generator=g) for n in lengths]

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        return self.tokens[i], self.tokens[i] % 3


class PadTags:
    """collate_fn: a list of (tokens, tags) -> (tokens [B, T], tags [B, T]), padded to the batch's longest."""

    def __init__(self, pad_token: int = PAD_TOKEN, pad_tag: int = PAD_TAG):
        self.pad_token, self.pad_tag = pad_token, pad_tag

    def __call__(self, samples):
        tokens, tags = zip(*samples)
        return (pad_sequence(tokens, batch_first=True, padding_value=self.pad_token),
                pad_sequence(tags, batch_first=True, padding_value=self.pad_tag))


class Tagger(nn.Module):
    """Token ids [B, T] -> tag scores [B, num_classes, T] (the class dimension second, as cross-entropy takes it)."""

    def __init__(self, num_classes, vocab: int = 32, hidden: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=PAD_TOKEN)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, tokens):
        return self.head(self.embed(tokens)).transpose(1, 2)
