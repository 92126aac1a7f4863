"""The GradScaler replay matches torch.amp.GradScaler itself, fed the same FP16 gradients."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fpsim.analyze.gradscaler import per_step_amax, simulate_gradscaler
from fpsim.analyze.limits import FormatLimits

AMAX = [1e-3] * 4 + [30.0] + [2e-3] * 9 + [0.9] + [1e-4] * 6 + [math.nan] + [5e-3] * 8 + [2.0] + [1e-3] * 5


def torch_scales(amax, growth_interval: int):
    """Scale before each step and skipped steps of a real GradScaler whose FP16 gradient is amax * scale."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=growth_interval)
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scales, skipped = [], 0
    for a in amax:
        scaler.scale(torch.ones(()))            # initialises the scale, as scaler.scale(loss) does
        scale = scaler.get_scale()
        scales.append(scale)
        p.grad = torch.tensor([a * scale], dtype=torch.float32).half().float()  # FP16 gradient: Inf on overflow
        scaler.step(opt)
        if not all(torch.isfinite(p.grad)):
            skipped += 1
        scaler.update()
    return scales, skipped, scaler.get_scale()


@pytest.mark.parametrize("growth_interval", [3, 2000])
def test_replay_equals_torch_gradscaler(growth_interval):
    real_scales, real_skipped, real_final = torch_scales(AMAX, growth_interval)
    prediction = simulate_gradscaler(np.array(AMAX, dtype=np.float32), 1, len(AMAX), FormatLimits.of("fp16"),
                                     growth_interval=growth_interval)
    ours = []
    changes = dict(prediction.trajectory)
    scale = changes[0]
    for step in range(len(AMAX)):
        scale = changes.get(step, scale)
        ours.append(scale)
    assert ours == real_scales
    assert prediction.skipped_steps == real_skipped
    assert prediction.final_scale == real_final


def test_unobserved_steps_reuse_the_last_observed_amax():
    entries = np.array([2.0, -np.inf, -np.inf, 5.0, -np.inf, -np.inf], dtype=np.float32)
    np.testing.assert_array_equal(per_step_amax(entries, 1, 6), [2, 2, 2, 5, 5, 5])
    np.testing.assert_array_equal(per_step_amax(entries[:3], 2, 5), [2, 2, 2, 2, 2])
    assert per_step_amax(np.full(4, -np.inf, dtype=np.float32), 1, 4) is None


def test_the_replay_of_an_fp32_run_skips_what_a_real_gradscaler_run_skips():
    # The reference: the same model and data under CPU autocast FP16 with a real torch.amp.GradScaler (its
    # defaults), which scales the FP32 loss in FP32. Before, the seed of loss.backward() (ones_like of the loss),
    # and loss.item(), hooked the loss op as if they consumed it: its "gradient" 1 x 2^16 overflowed FP16 and
    # the replay predicted a skipped first step that the real scaler never makes
    from torch import nn

    from fpsim.analyze import watch

    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))

    inputs = [torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    real = make()
    optimizer, scaler, skipped = torch.optim.SGD(real.parameters(), lr=0.01), torch.amp.GradScaler("cpu"), 0
    for x in inputs:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = real(x).float().pow(2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        skipped += scaler.get_scale() < scale
    model = make()
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.01), []
    with watch(model, formats=("fp16",)) as w:
        for x in inputs:
            loss = model(x).pow(2).mean()
            losses.append(loss.item())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    report = w.report()
    assert report.gradscaler["fp16"].skipped_steps == skipped == 0
    assert [sorted(op.tensors) for op in report.ops if op.name == "loop:mean"] == [["activation"]]
    assert report.layer("2").tensors["activation_grad"].amax < 1   # the gradients themselves are as before
