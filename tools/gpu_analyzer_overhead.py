"""The analyzer's cost on a real GPU training step (issue 17, step 1), from the repository root:

    python3 tools/gpu_analyzer_overhead.py OUT.json          # on a CUDA machine: 12 layers, 768 wide
    python3 tools/gpu_analyzer_overhead.py OUT.json --tiny   # a dry run on any machine (2 layers, 64 wide)

A nanoGPT-style GPT (fpsim.analyze.gpt) trained with AdamW under torch.autocast in bf16 and in fp16
(the latter with a GradScaler), timed unobserved, watched every step and every 10th step, in one
process on the same batches; each time is the best of `--repeats` runs of `--steps` steps after a
warm-up. Writes the times, the ratios and each watched run's hook error (None when the hooks ran
clean) as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches


def run(config, batches, dtype, device, watch_every, repeats):
    """Best seconds per step of training on `batches`, with fpsim.watch(every=...) or unobserved."""
    best, error = float("inf"), None
    for _ in range(repeats):
        torch.manual_seed(0)
        model = GPT(config).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        watcher = fpsim.watch(model, every=watch_every) if watch_every else None

        def step(x, y):
            with torch.autocast(device.type, dtype=dtype):
                _, loss = model(x, y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        if watcher is not None:
            watcher.__enter__()
        try:
            for x, y in batches[:3]:  # warm-up
                step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for x, y in batches[3:]:
                step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / (len(batches) - 3))
        finally:
            if watcher is not None:
                watcher.__exit__(None, None, None)
                error = watcher.observation_error
    return best, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tiny", action="store_true", help="2 layers, 64 wide, on the CPU when there is no GPU")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per run (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.tiny:
        config, batch = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32), 4
    else:
        config, batch = GPTConfig(n_layer=12, n_embd=768, n_head=12, block_size=256, vocab_size=512), 16
    batches = [(x.to(device), y.to(device)) for x, y in token_batches(config, batch, args.steps + 3)]
    result = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "config": vars(config), "batch": batch, "steps": args.steps, "runs": {}}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        plain, _ = run(config, batches, dtype, device, None, args.repeats)
        entry = {"unobserved_s_per_step": plain}
        for every in (1, 10):
            seconds, error = run(config, batches, dtype, device, every, args.repeats)
            entry[f"every_{every}"] = {"s_per_step": seconds, "ratio": seconds / plain,
                                       "hook_error": None if error is None else str(error)}
        result["runs"][name] = entry
        print(name, json.dumps(entry), flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
