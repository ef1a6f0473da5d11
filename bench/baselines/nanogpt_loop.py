"""Hand-written baseline for bench/char_lm.py: a nanoGPT-style character-level training loop, written out the way
nanoGPT's train.py does it, without this framework (it never imports framework). The same model as
experiment=char_lm (a pre-norm causal transformer, tied head), the same text (The Devil's Dictionary from Debian's
dict-devil, blocks of block_size + 1 characters, the first 90% for training), AdamW, gradient clipping at 1.0.
One process, or one per rank under torchrun (DistributedDataParallel, each rank its shard of the blocks).

    python bench/baselines/nanogpt_loop.py --steps 80 --log-every 20
    torchrun --standalone --nproc_per_node=2 bench/baselines/nanogpt_loop.py --steps 80

Prints 'training ...' right before the loop and 'step S/T | loss L' every --log-every steps (train.py's markers)."""
import argparse
import gzip
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

TEXT = "/usr/share/dictd/devil.dict.dz"


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(), nn.Linear(4 * d, d, bias=False))
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln_1(x)).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, d):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight"))
                                else 0.02)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split over the ranks")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    ddp = "RANK" in os.environ
    rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if ddp else (0, 1)
    if ddp:
        dist.init_process_group("gloo")
    text = gzip.decompress(open(TEXT, "rb").read()).decode()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("00-database")) + "\n"
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text])[: int(len(text) * 0.9)]
    blocks = (len(ids) - 1) // args.block_size
    windows = ids[: blocks * args.block_size + 1]
    x_all, y_all = windows[:-1].view(blocks, -1), windows[1:].view(blocks, -1)

    torch.manual_seed(42)
    model = GPT(len(vocab), args.block_size, args.layers, args.heads, args.embd)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    micro = args.batch_size // world
    per_epoch = blocks // args.batch_size
    if rank == 0:
        print(f"training GPT, nanoGPT-style loop: {world} process(es), batch {args.batch_size}, block "
              f"{args.block_size}, {args.steps} steps, {torch.get_num_threads()} threads", flush=True)
    model.train()
    step, epoch = 0, 0
    while step < args.steps:
        order = torch.randperm(blocks, generator=torch.Generator().manual_seed(42 + epoch))[rank::world]
        for i in range(per_epoch):
            idx = order[i * micro:(i + 1) * micro]
            logits = model(x_all[idx])
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y_all[idx].view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            step += 1
            if step % args.log_every == 0 and rank == 0:
                print(f"step {step}/{args.steps} | loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
