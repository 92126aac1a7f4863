"""Cost of shadow steps: step time with fpsim.watch(every=10, shadow_every=10) against the same training unobserved.

    python benchmarks/bench_shadow.py [--models demo,gpt] [--repeats 3] [--threads 1]

Each model trains from the same initial weights, interleaved `repeats` times:
unobserved; observed every 10th step (the peer: watch without shadow steps);
observed and shadowed every 10th step with the default formats (fp16, bf16,
e4m3, e5m2), FP16/BF16 replayed emulated (the default) and through torch's
own autocast kernels (shadow numerics "autocast"); and with bf16 alone. A
run's time is the mean step time over steps 50..99: five shadowed steps, one
whole rotation of the default formats' turns (the noise floor, then each
format: fpsim.analyze.shadow), after a first rotation in steps 0..49 (the
first emulated replay of each format fills per-op caches once, a cost that
a training run pays once); a configuration's time is the fastest of its runs. Target: shadowed every 10th step <= 1.3x the unobserved run. Wall and
process CPU time are both printed: on a machine shared with other work, CPU
time (one thread) is the steadier of the two. The CPU time of the replays
themselves (ShadowSteps.before_step) is printed as c, one shadow step's cost in
unobserved steps: the steadiest figure of all, as it leaves out the plain steps'
own swings.

The step time of real CPU autocast FP16 and BF16 training against FP32 is
printed beside: what one replay through torch's CPU autocast kernels costs
(no FP16/BF16 matrix units on most CPUs), the reason for emulated numerics.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

from common import demo_batches
from fpsim.analyze import watch
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

WARMUP, MEASURED = 50, 50


def demo_model():
    model, batch = demo_batches()
    return "demo model (SensorNet, batch 1024, Adam)", model, batch, nn.functional.cross_entropy


def small_gpt():
    cfg = GPTConfig(vocab_size=65, block_size=64, n_layer=2, n_head=4, n_embd=64)
    batches = token_batches(cfg, 16, 10**5)
    torch.manual_seed(0)

    def loss_fn(logits, y):
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))

    def batch():
        x, y = next(batches)
        return (x,), y
    return "GPT (2 layers x 64, batch 16 x 64 tokens, Adam)", GPT(cfg), batch, loss_fn


MODELS = {"demo": demo_model, "gpt": small_gpt}


def timed_run(model, batch, loss_fn, options: dict | None, autocast=None) -> tuple:
    """Mean (wall, CPU) seconds per step over steps WARMUP..WARMUP+MEASURED-1, and the CPU seconds the shadow
    replays took in them (0 without shadow steps); under watch(**options) when given."""
    model = copy.deepcopy(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    options = dict(options) if options is not None else None
    numerics = options.pop("shadow_numerics", None) if options is not None else None
    w = watch(model, **options).attach() if options is not None else None
    if numerics is not None:
        w.shadow.numerics = numerics
    replays = [0.0]
    if w is not None and w.shadow is not None:
        replay = w.shadow.before_step

        def timed_replay(*args, **kwargs):        # the shadow steps' replays, timed on their own
            start_replay = time.process_time()
            replay(*args, **kwargs)
            if step >= WARMUP:
                replays[0] += time.process_time() - start_replay
        w.shadow.before_step = timed_replay
    try:
        for step in range(WARMUP + MEASURED):
            if step == WARMUP:
                start, start_cpu = time.perf_counter(), time.process_time()
            x, y = batch()
            if autocast is not None:
                with torch.autocast("cpu", dtype=autocast):
                    out = model(*x)
            else:
                out = model(*x)
            loss = loss_fn(out.float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return ((time.perf_counter() - start) / MEASURED, (time.process_time() - start_cpu) / MEASURED,
                replays[0])
    finally:
        if w is not None:
            w.close()


CONFIGS = {
    "unobserved": None,
    "watch every 10 (peer)": {"every": 10},
    "watch + shadow every 10": {"every": 10, "shadow_every": 10},
    "watch + shadow every 10, autocast": {"every": 10, "shadow_every": 10, "shadow_numerics": "autocast"},
    "watch + shadow every 10, bf16 only": {"every": 10, "shadow_every": 10, "formats": ("bf16",)},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,gpt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for key in args.models.split(","):
        title, model, batch, loss_fn = MODELS[key]()
        times = {name: [] for name in [*CONFIGS, "autocast fp16 training", "autocast bf16 training"]}
        for _ in range(args.repeats):
            for name, options in CONFIGS.items():
                times[name].append(timed_run(model, batch, loss_fn, options))
            times["autocast fp16 training"].append(timed_run(model, batch, loss_fn, None, torch.float16))
            times["autocast bf16 training"].append(timed_run(model, batch, loss_fn, None, torch.bfloat16))
        base = [min(t[i] for t in times["unobserved"]) for i in (0, 1)]
        print(f"{title}: {MEASURED} steps after {WARMUP}, best of {args.repeats}, {args.threads} thread(s); "
              f"wall and process CPU time")
        for name, values in times.items():
            wall, cpu = (min(t[i] for t in values) for i in (0, 1))
            print(f"  {name:<36} {wall * 1e3:9.2f} ms/step {wall / base[0]:6.2f}x   CPU {cpu * 1e3:9.2f} ms/step "
                  f"{cpu / base[1]:6.2f}x unobserved")
        for name, values in times.items():
            replays = min(t[2] for t in values)
            if replays:
                shadowed = MEASURED // CONFIGS[name]["shadow_every"]
                print(f"  {name}: replays {replays / shadowed * 1e3:.1f} ms CPU per shadowed step, c = "
                      f"{replays / shadowed / base[1]:.2f} unobserved steps (the rest of the ratio: observation "
                      f"and capture)")


if __name__ == "__main__":
    main()
