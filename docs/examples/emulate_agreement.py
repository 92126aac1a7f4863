"""Emulated bf16/fp16 steps next to real CPU autocast steps on a GPT (docs/emulate.md).

    python docs/examples/emulate_agreement.py

The real run trains a GPT (2 layers, 64 wide, batch 4 x 32 tokens) with CPU autocast and
AdamW. At each step, from the real run's current weights, the step's loss and gradients are
also computed by fpsim.emulate(policy="cpu") and in FP32; the table compares each with the
real step: the loss's relative difference, the share of gradient elements equal bit for bit,
and the largest relative difference of a parameter's gradient, ||g - g_real|| / ||g_real||.
"""

import copy

import torch

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

torch.set_num_threads(1)
config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32)


def step(model, x, y, fmt=None, emulated=False):
    model = copy.deepcopy(model)
    if emulated:
        with fpsim.emulate(model, fmt, policy="cpu"):
            _, loss = model(x, y)
            loss.backward()
    else:
        with torch.autocast("cpu", dtype=getattr(torch, fmt) if fmt else None, enabled=fmt is not None):
            _, loss = model(x, y)
        loss.backward()
    return loss.item(), {name: p.grad for name, p in model.named_parameters()}


def compare(loss, grads, real_loss, real_grads):
    equal = sum(int((grads[n] == real_grads[n]).sum()) for n in grads) / sum(g.numel() for g in grads.values())
    worst = max(((grads[n] - real_grads[n]).norm() / real_grads[n].norm()).item() for n in grads)
    return f"{abs(loss - real_loss) / real_loss:9.1e} {equal:7.1%} {worst:10.1e}"


print(f"{'':10}{'':6}{'emulated vs real':>28}  {'FP32 vs real':>28}")
print(f"{'format':<10}{'step':<6}{'loss':>9} {'equal':>7} {'gradient':>10}  {'loss':>9} {'equal':>7} {'gradient':>10}")
for fmt, name in (("bfloat16", "bf16"), ("float16", "fp16")):
    torch.manual_seed(0)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i, (x, y) in enumerate(token_batches(config, 4, 4, seed=1)):
        real = step(model, x, y, fmt)
        emulated = step(model, x, y, name, emulated=True)
        fp32 = step(model, x, y)
        print(f"{name:<10}{i:<6}{compare(*emulated, *real)}  {compare(*fp32, *real)}")
        with torch.autocast("cpu", dtype=getattr(torch, fmt)):
            _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
