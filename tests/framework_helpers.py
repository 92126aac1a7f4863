"""A tiny GPT-2 and its token data set, for the tests that train through transformers and Lightning.

Built from a config with random weights (nothing is downloaded); the data are random token ids from a
seeded generator per item, so every run sees the same batches.
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
