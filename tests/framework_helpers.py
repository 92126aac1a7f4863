"""Small models shared by the tests that train: a tiny GPT-2 and its token data set (through transformers and
Lightning), and a model with a checkpointed block (the analyzer's replays and the emulation).

The GPT-2 is built from a config with random weights (nothing is downloaded); the data are random token ids
from a seeded generator per item, so every run sees the same batches.
"""

from __future__ import annotations

import torch


def tiny_gpt2():
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                     attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


class Tokens(torch.utils.data.Dataset):
    """32 items of 16 token ids in 0..63; each is its own labels (language modelling)."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Checkpointed(torch.nn.Module):
    """Linear, Dropout, ReLU; a Linear+Tanh block under torch.utils.checkpoint (reentrant or not) or run plainly
    (None); a head of 3 outputs."""

    def __init__(self, reentrant, inputs: int = 10):
        super().__init__()
        nn = torch.nn
        self.a = nn.Sequential(nn.Linear(inputs, 32), nn.Dropout(0.2), nn.ReLU())
        self.b = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 3)
        self.reentrant = reentrant

    def forward(self, x):
        h = self.a(x)
        if self.reentrant is None:
            return self.head(self.b(h))
        return self.head(torch.utils.checkpoint.checkpoint(self.b, h, use_reentrant=self.reentrant))
