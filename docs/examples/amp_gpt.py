"""A small GPT trained with CPU autocast FP16 and a GradScaler, as AMP scripts do (docs/analyzer.md).

    fpsim analyze --steps 30 --formats fp16,bf16 --out amp-report docs/examples/amp_gpt.py
    fpsim analyze --steps 30 --formats fp16,bf16 --out planted docs/examples/amp_gpt.py -- --fp32 --logit-gain 1e6

With `--logit-gain G` the attention logits q @ k^T * scale are G times larger:
at 1e6 they reach beyond FP16's 65504 inside the attention module, whose
output (a projection after the softmax) stays small. `--fp32` trains without
autocast and GradScaler.
"""

import argparse

import torch

from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

parser = argparse.ArgumentParser()
parser.add_argument("--logit-gain", type=float, default=1.0)
parser.add_argument("--fp32", action="store_true", help="no autocast, no GradScaler")
parser.add_argument("--steps", type=int, default=100)
args = parser.parse_args()

torch.set_num_threads(1)
torch.manual_seed(0)
config = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32, logit_gain=args.logit_gain)
model = GPT(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", enabled=not args.fp32)
for step, (x, y) in enumerate(token_batches(config, 8, args.steps)):
    with torch.autocast("cpu", dtype=torch.float16, enabled=not args.fp32):
        _, loss = model(x, y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
print(f"loss {loss.item():.3f}, GradScaler scale {scaler.get_scale():g}")
