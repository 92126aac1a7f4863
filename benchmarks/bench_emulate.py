"""Step time under fpsim.emulate, as a ratio to the same training unemulated (FP32), in the same process.

    python benchmarks/bench_emulate.py [--steps 6] [--repeats 3] [--threads 1] [--skip-tensor-core]

A 10M-parameter GPT (fpsim.analyze.gpt: 6 layers, 384 wide, block 128, batch 8, AdamW)
trains `steps` steps from the same initial weights unemulated and under the emulated recipes
bf16, fp16 (fixed loss scale 2^12) and fp8 (hybrid, delayed scaling, bf16 elsewhere), all
with FP32 accumulation, interleaved `repeats` times. A run's time is its mean step time after
`warmup` steps; a configuration's time is the fastest of its runs (the least disturbed by
other work on the machine; medians are printed too). Target: every recipe <= 4x.

The tensor-core model (device="h100") walks K block by block in Python-level torch
operations, so it is timed on a small GPT (2 layers, 64 wide, block 32, batch 4) against the
same model unemulated and emulated with FP32 accumulation.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

RECIPES = {"fp32 (unemulated)": None, "bf16": ("bf16", {}), "fp16, loss scale 2^12": ("fp16", {"loss_scale": 4096.0}),
           "fp8 (hybrid, delayed)": ("fp8", {})}
TENSOR_CORE = {"fp32 (unemulated)": None, "bf16, FP32 accumulation": ("bf16", {}),
               "bf16, device=h100": ("bf16", {"device": "h100"}), "fp8, device=h100": ("fp8", {"device": "h100"})}


def gpt10m():
    cfg = GPTConfig(vocab_size=65, block_size=128, n_layer=6, n_head=6, n_embd=384)
    torch.manual_seed(0)
    model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    return f"GPT ({n / 1e6:.1f}M parameters, 6 layers, batch 8 x 128 tokens, AdamW)", cfg, model, 8


def small_gpt():
    cfg = GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64)
    torch.manual_seed(0)
    model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    return f"GPT ({n / 1e3:.0f}k parameters, 2 layers, batch 4 x 32 tokens, AdamW)", cfg, model, 4


def timed_run(model, cfg, batch: int, steps: int, warmup: int, recipe) -> float:
    """Mean seconds per step over the steps after `warmup`, optionally under fpsim.emulate."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = list(token_batches(cfg, batch, warmup + steps))
    context = fpsim.emulate(model, recipe[0], **recipe[1]) if recipe else contextlib.nullcontext()
    with context:
        for step, (x, y) in enumerate(batches):
            if step == warmup:
                start = time.perf_counter()
            _, loss = model(x, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return (time.perf_counter() - start) / steps


def measure(title, cfg, model, batch, configs, args, steps):
    times = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, recipe in configs.items():
            times[name].append(timed_run(copy.deepcopy(model), cfg, batch, steps, args.warmup, recipe))
    base, base_median = min(times["fp32 (unemulated)"]), statistics.median(times["fp32 (unemulated)"])
    print(f"{title}, {args.threads} thread(s), {steps} steps x {args.repeats} interleaved repeats; "
          f"step time, fastest run (median run):")
    for name in configs:
        t, m = min(times[name]), statistics.median(times[name])
        print(f"  {name:<26} {t * 1e3:9.1f} ms   ratio {t / base:6.2f}   ({m * 1e3:9.1f} ms, ratio "
              f"{m / base_median:6.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per run of the 10M GPT")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tensor-core-steps", type=int, default=2, help="timed steps per run of the small GPT")
    parser.add_argument("--skip-tensor-core", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    measure(*gpt10m(), RECIPES, args, args.steps)
    print("target: every recipe <= 4x the unemulated step")
    if not args.skip_tensor_core:
        measure(*small_gpt(), TENSOR_CORE, args, args.tensor_core_steps)


if __name__ == "__main__":
    main()
