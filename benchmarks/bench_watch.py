"""Step time of the demo model with fpsim.watch attached, as a ratio to the same training without it.

    python benchmarks/bench_watch.py [--steps 40] [--repeats 5] [--threads 1]

The demo's SensorNet (hidden 256, depth 5, batch 1024, Adam) trains `steps`
steps from the same initial weights, unobserved, observed every step and
observed every 10th step, interleaved `repeats` times. Each run's time is its
mean step time after `warmup` steps; a configuration's time is the fastest
of its runs (the least disturbed by other work on the machine; the medians
are printed too). Targets: at most 1.10 every 10 steps, at most 1.5 every step.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time

import torch
from torch import nn

from fpsim.analyze import watch
from fpsim.analyze.demo import DEMO_BATCH, SensorNet, sensor_data


def timed_run(model, data, steps: int, warmup: int, every: int | None) -> float:
    """Mean seconds per step over the steps after `warmup`, optionally under fpsim.watch(every=...)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    context = watch(model, every=every) if every else contextlib.nullcontext()
    with context:
        for step in range(warmup + steps):
            if step == warmup:
                start = time.perf_counter()
            i = torch.randint(0, 12288, (DEMO_BATCH,), generator=g)
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (a multiple of 10)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = sensor_data()
    torch.manual_seed(0)
    initial = SensorNet()
    configs = {"unobserved": None, "every step": 1, "every 10 steps": 10}
    times = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, every in configs.items():
            times[name].append(timed_run(copy.deepcopy(initial), data, args.steps, args.warmup, every))
    base, base_median = min(times["unobserved"]), statistics.median(times["unobserved"])
    print(f"demo model (SensorNet, batch {DEMO_BATCH}), {args.threads} thread(s), {args.steps} steps x "
          f"{args.repeats} interleaved repeats; step time, fastest run (median run):")
    for name in configs:
        t, m = min(times[name]), statistics.median(times[name])
        print(f"  {name:<16} {t * 1e3:7.1f} ms   ratio {t / base:5.2f}   ({m * 1e3:7.1f} ms, ratio "
              f"{m / base_median:5.2f})")
    print("targets: every 10 steps <= 1.10, every step <= 1.5")


if __name__ == "__main__":
    main()
