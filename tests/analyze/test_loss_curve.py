"""The analyzer's advice, tried: FP16-rounded gradients at scale 1 and at the recommended scale, against FP32.

The FP16 runs round every gradient the way FP16 storage would (tensor hooks
scale by S, round with fpsim.quantize, unscale): each watched module's output
gradient and each parameter gradient, except in the layers the analyzer says
to keep in FP32.
"""

from __future__ import annotations

import pytest
import torch

import fpsim
from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data, train

STEPS, BATCH = 200, 1024


def fresh_model():
    torch.manual_seed(0)
    return SensorNet(hidden=32, depth=6)


def fp16_gradients(model, log2_scale: int, keep_fp32=()):
    scale = 2.0**log2_scale

    def to_fp16(grad):
        return fpsim.quantize(grad * scale, "fp16") / scale

    def on_output(module, args, output):
        if output.requires_grad:
            output.register_hook(to_fp16)

    for name, module in model.named_modules():
        if name and name not in keep_fp32 and any(True for _ in module.parameters(recurse=False)):
            module.register_forward_hook(on_output)
            for p in module.parameters(recurse=False):
                p.register_hook(to_fp16)
    return model


def tail_loss(losses) -> float:
    return sum(losses[-20:]) / 20


@pytest.fixture(scope="module")
def curves():
    torch.set_num_threads(1)
    data = sensor_data(samples=8192)
    model = fresh_model()
    with watch(model, formats=("fp16",)) as w:
        train(model, data, 40, batch=BATCH)
    report = w.report()
    recommended = report.loss_scale["fp16"].recommended_log2
    keep = [layer.name for layer in report.layers if report.verdict(layer.name, "fp16") == "fp32"]
    return {
        "report": report, "recommended": recommended, "keep": keep,
        "fp32": train(fresh_model(), data, STEPS, batch=BATCH),
        "fp16 at 1": train(fp16_gradients(fresh_model(), 0), data, STEPS, batch=BATCH),
        "fp16 advised": train(fp16_gradients(fresh_model(), recommended, keep), data, STEPS, batch=BATCH),
    }


def test_the_analyzer_predicted_fp16_underflow(curves):
    report = curves["report"]
    assert any(report.verdict(layer.name, "fp16") == "loss_scale" for layer in report.layers)
    assert curves["recommended"] > 0


def test_scale_1_degrades_training_and_the_recommended_scale_does_not(curves):
    fp32, at_1, advised = (tail_loss(curves[k]) for k in ("fp32", "fp16 at 1", "fp16 advised"))
    assert at_1 > fp32 + 0.15, (fp32, at_1)             # visibly worse: the early layers get zero gradients
    assert abs(advised - fp32) < 0.02, (fp32, advised)  # close to FP32 all along
    assert max(abs(a - b) for a, b in zip(curves["fp32"], curves["fp16 advised"])) < 0.05
