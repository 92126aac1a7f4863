"""`fpsim demo`: train a small sensor classifier on generated data, observe it, write the report.

Nothing is downloaded: the data set is generated from a seed. Each sample has
24 standardised readings and 4 absolute pressures in pascals (about 1.013e5
Pa, varying by a few kPa); its class (one of 5) comes from a fixed random
two-layer "teacher" network of all 28 readings. The student, `SensorNet`,
feeds the raw pressures to a small Linear layer followed by a LayerNorm (the
way such data often reaches a model), joins them to the other readings and
classifies them with a deep stack of Linear + Sigmoid layers, trained with
Adam on a mean cross-entropy over batches of 1024.

Nothing is scaled by hand; what the report shows follows from ordinary
training dynamics:
- the pressure layer's outputs are of order 1e5, beyond FP16's max 65504;
- the LayerNorm behind it divides the gradients flowing back by their spread
  (about 1e4), so that layer's gradients are tiny;
- each Sigmoid multiplies gradients by at most 1/4 (the textbook vanishing
  gradient), and the mean over 1024 samples divides them again, so the
  gradients of the early Linear layers fall below FP16's smallest subnormal
  (2^-24, 6e-8): at loss scale 1 a large share of them flushes to zero.
"""

from __future__ import annotations

import contextlib
import math
import time

import torch
from torch import nn

from .shadow import COMMAND_LINE_EVERY

DEMO_STEPS = 400
DEMO_BATCH = 1024
DEMO_SEED = 0
CLASSES = 5
TRAIN_SAMPLES = 12288
TEST_SAMPLES = 4096


def sensor_data(samples: int = TRAIN_SAMPLES + TEST_SAMPLES, seed: int = DEMO_SEED) -> dict:
    """The generated data set: {'readings' (N, 24), 'pressure' (N, 4) in Pa, 'label' (N,)}, float32."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be a positive int, got {samples!r}")
    g = torch.Generator().manual_seed(seed)
    readings = torch.randn(samples, 24, generator=g)
    pressure_anomaly = torch.randn(samples, 4, generator=g)
    teacher_in = torch.randn(28, 32, generator=g) / math.sqrt(28)
    teacher_out = torch.randn(32, CLASSES, generator=g)
    hidden = torch.tanh(torch.cat([readings, pressure_anomaly], 1) @ teacher_in * 0.5)
    label = (hidden @ teacher_out).argmax(1)
    pressure = 101325.0 + 2500.0 * pressure_anomaly  # absolute pressure in pascals
    return {"readings": readings, "pressure": pressure, "label": label}


class SensorNet(nn.Module):
    """Raw pressures -> Linear -> LayerNorm, joined to the readings -> (Linear, Sigmoid) x depth -> Linear."""

    def __init__(self, hidden: int = 256, depth: int = 5, classes: int = CLASSES):
        super().__init__()
        self.pressure = nn.Linear(4, 16)
        self.pressure_norm = nn.LayerNorm(16)
        layers = [nn.Linear(24 + 16, hidden), nn.Sigmoid()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.Sigmoid()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(hidden, classes)

    def forward(self, readings, pressure):
        features = torch.cat([readings, self.pressure_norm(self.pressure(pressure))], dim=1)
        return self.head(self.body(features))


def train(model, data: dict, steps: int, *, batch: int = DEMO_BATCH, lr: float = 3e-3, seed: int = DEMO_SEED,
          on_loss=None) -> list:
    """Adam on mean cross-entropy over random training batches; the losses, one per step.

    Batches come from a generator seeded with `seed`, so two calls with the
    same model initialisation train identically.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + 1)
    train_size = min(TRAIN_SAMPLES, len(data["label"]))
    losses = []
    for _ in range(steps):
        i = torch.randint(0, train_size, (batch,), generator=g)
        loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_loss is not None:
            on_loss(losses[-1])
    return losses


def test_accuracy(model, data: dict) -> float:
    with torch.no_grad():
        logits = model(data["readings"][TRAIN_SAMPLES:], data["pressure"][TRAIN_SAMPLES:])
        return (logits.argmax(1) == data["label"][TRAIN_SAMPLES:]).float().mean().item()


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Run with `threads` intra-op threads and restore the previous setting after."""
    if threads is None:
        yield
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_demo(out="fpsim-report", *, steps: int = DEMO_STEPS, every: int = 1,
             shadow_every: int | None = COMMAND_LINE_EVERY,
             recipes_every: int | None = None, formats=None, seed: int = DEMO_SEED,
             threads: int | None = 1, on_step=None, save: bool = True):
    """Train SensorNet under fpsim.watch and write the report to `out`; (report, paths, facts).

    facts: {'seconds', 'test_accuracy', 'first_loss', 'last_loss'}. One thread by
    default: the model is small, and a busy machine slows a multi-threaded run
    far more than a single-threaded one.
    """
    from .hooks import DEFAULT_FORMATS, watch

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    start = time.perf_counter()
    with torch_threads(threads):
        data = sensor_data(seed=seed)
        torch.manual_seed(seed)
        model = SensorNet()
        with watch(model, formats=formats or DEFAULT_FORMATS, every=every, shadow_every=shadow_every,
                   recipes_every=recipes_every, on_step=on_step, out=out if save else None) as w:
            losses = train(model, data, steps, seed=seed)
        report = w.last_report if save else w.report()
        accuracy = test_accuracy(model, data)
    paths = w.saved_paths
    facts = {"seconds": time.perf_counter() - start, "test_accuracy": accuracy,
             "first_loss": losses[0], "last_loss": losses[-1]}
    return report, paths, facts
