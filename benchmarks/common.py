"""Pieces several benchmarks share: a fastest-of timer, the demo model's batches, a 12-layer GPT's report.

The scripts run as `python benchmarks/NAME.py`, so this folder is on sys.path and they import it as `common`.
"""

from __future__ import annotations

import time


def fastest(function, repeats: int, clock=time.perf_counter) -> float:
    """Seconds of the fastest of `repeats` calls (the least disturbed by other work on the machine), on
    `clock` (wall time; time.process_time: this process's CPU time)."""
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        function()
        best = min(best, clock() - start)
    return best


def demo_batches():
    """The demo's SensorNet (seeded) and a function giving its next training batch ((readings, pressure), label)."""
    import torch

    from fpsim.analyze.demo import DEMO_BATCH, SensorNet, sensor_data

    data = sensor_data()
    g = torch.Generator().manual_seed(1)

    def batch():
        i = torch.randint(0, 12288, (DEMO_BATCH,), generator=g)
        return (data["readings"][i], data["pressure"][i]), data["label"][i]

    torch.manual_seed(0)
    return SensorNet(), batch


def gpt_report():
    """The report of a 12-layer GPT (64 wide) watched for 3 AdamW steps with the default options."""
    import torch

    from fpsim.analyze import watch
    from fpsim.analyze.gpt import GPT, GPTConfig, token_batches

    cfg = GPTConfig(n_layer=12, n_embd=64, n_head=4, block_size=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with watch(model) as w:
        for x, y in token_batches(cfg, 4, 3):
            _, loss = model(x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return w.report()
