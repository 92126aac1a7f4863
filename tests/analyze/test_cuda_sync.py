"""On CUDA the hooks never synchronise with the host (runs only where a GPU is present)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def steps(model, data, n: int, strict_from: int) -> None:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    try:
        for step in range(n):
            if step == strict_from:                 # after the first steps, which fill the caches
                torch.cuda.set_sync_debug_mode("error")
            i = torch.arange(step * 64, step * 64 + 64, device="cuda")
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_observed_steps_do_not_synchronise():
    data = {k: v.cuda() for k, v in sensor_data(samples=1024).items()}
    torch.manual_seed(0)
    model = SensorNet(hidden=64, depth=3).cuda()
    try:
        steps(model, data, 4, strict_from=2)
    except RuntimeError as err:  # the loop itself synchronises on this torch build: nothing to test
        pytest.skip(f"the unobserved training loop synchronises: {err}")
    with watch(model) as w:
        steps(model, data, 8, strict_from=3)
    report = w.report()                              # the one place that reads back
    assert report.layer("body.0").tensors["activation_grad"].samples == 8
