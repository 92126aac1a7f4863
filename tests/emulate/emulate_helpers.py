"""Shared pieces of the emulation tests: small GPTs, and training loops run by real torch autocast or by fpsim.emulate."""

from __future__ import annotations

import contextlib
import copy

import torch

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TINY = {"bf16": GPTConfig(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=16),
        "fp16": GPTConfig(n_layer=1, n_embd=8, n_head=2, block_size=8, vocab_size=16)}
"""GPTs small enough that every float32 sum of their GEMMs is exact, so the CPU's low-precision GEMM
kernels and float32 ones agree whatever their order: real and emulated steps match bit for bit."""


def gpt(cfg: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(cfg)


def train(model, cfg, steps: int, forward_context=contextlib.nullcontext, scaler=None, lr=1e-2, batch=2):
    """`steps` AdamW steps; the forward pass and loss under forward_context() (an AMP loop's autocast).
    Returns [(loss, {name: grad})] per step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    records = []
    for x, y in token_batches(cfg, batch, steps, seed=1):
        with forward_context():
            _, loss = model(x, y)
        optimizer.zero_grad()
        (scaler.scale(loss) if scaler else loss).backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        records.append((loss.detach().clone(), grads))
    return records


def real_autocast(fmt: str):
    """The forward context of a real CPU AMP loop."""
    return lambda: torch.autocast("cpu", dtype=DTYPES[fmt], cache_enabled=False)


def emulated(model, cfg, steps: int, recipe, scaler=None, batch=2, **options):
    """The same loop, unchanged, inside fpsim.emulate."""
    with fpsim.emulate(model, recipe, **options) as em:
        records = train(model, cfg, steps, scaler=scaler, batch=batch)
    return records, em


def assert_same_steps(got, expected):
    """Losses and every gradient equal bit for bit, step by step."""
    assert len(got) == len(expected)
    for step, ((loss, grads), (want_loss, want_grads)) in enumerate(zip(got, expected)):
        assert torch.equal(loss, want_loss), f"step {step}: loss {loss.item()!r} != {want_loss.item()!r}"
        assert grads.keys() == want_grads.keys()
        for name in grads:
            assert torch.equal(grads[name], want_grads[name]), f"step {step}: gradient of {name} differs"


def twin(model):
    return copy.deepcopy(model)
