"""A small GPT in the style of nanoGPT, for the docs, tests and benchmarks (nothing is downloaded).

`GPT(GPTConfig(...))` is a decoder-only transformer: token and position
embeddings, `n_layer` pre-norm blocks (LayerNorm, causal self-attention
written out as q @ k^T * scale, softmax and a projection; LayerNorm, an MLP
with GELU), a final LayerNorm and a head tied to the token embedding, as
nanoGPT's model.py has them. `logit_gain` multiplies the attention logits
(1: the usual 1/sqrt(head size)); a large gain plants logits beyond FP16's
range, as attention without scaling or with very large activations produces.
`token_batches` makes batches of a generated character stream.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    logit_gain: float = 1.0


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.scale = config.logit_gain / math.sqrt(config.n_embd // config.n_head)
        mask = torch.tril(torch.ones(config.block_size, config.block_size, dtype=torch.bool))
        self.register_buffer("mask", mask.view(1, 1, config.block_size, config.block_size), persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.mask[:, :, :T, :T], float("-inf"))
        att = self.attn_dropout(torch.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig = GPTConfig()):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight          # weight tying, as nanoGPT does
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def token_batches(config: GPTConfig, batch: int, steps: int, seed: int = 0):
    """`steps` (input, target) batches of a generated character stream: a seeded random walk over the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    length = steps * batch * config.block_size + config.block_size + 1
    walk = torch.randint(-2, 3, (length,), generator=g).cumsum(0) % config.vocab_size
    for step in range(steps):
        starts = torch.randint(0, length - config.block_size - 1, (batch,), generator=g)
        x = torch.stack([walk[s:s + config.block_size] for s in starts])
        y = torch.stack([walk[s + 1:s + 1 + config.block_size] for s in starts])
        yield x, y
