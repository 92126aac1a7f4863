"""Verdicts on real training runs, checked against the gradients themselves rounded by fpsim.quantize."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fpsim
from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data, train
from fpsim.analyze.histogram import Log2Histogram
from fpsim.analyze.limits import FormatLimits
from fpsim.analyze.verdicts import Layer, Settings, TensorStats, choose_loss_scale


@pytest.fixture(scope="module")
def observed_run():
    """SensorNet (raw pascals into `pressure`, deep Sigmoid stack) trained 30 steps in FP32, watched,
    with every activation gradient of body.0 and every output of `pressure` kept for checking."""
    torch.set_num_threads(1)
    data = sensor_data(samples=4096)
    torch.manual_seed(0)
    model = SensorNet(hidden=32, depth=6)
    kept = {"grad": [], "out": []}

    def keep(module, args, output):
        kept["out"].append(output.detach().clone())

    def keep_grad(module, args, output):
        output.register_hook(lambda g: kept["grad"].append(g.detach().clone()))

    h1 = model.pressure.register_forward_hook(keep)
    h2 = model.body[0].register_forward_hook(keep_grad)
    with watch(model) as w:
        train(model, data, 30, batch=1024)
    h1.remove()
    h2.remove()
    return w.report(), kept


def flushed_fraction(values: torch.Tensor, log2_scale: int) -> float:
    scaled = values.double() * 2.0**log2_scale
    nonzero = scaled != 0
    rounded = torch.as_tensor(fpsim.quantize(scaled, "fp16"))
    return float(((rounded == 0) & nonzero).sum() / nonzero.sum())


def test_forward_overflow_means_fp32_for_fp16_only(observed_run):
    report, kept = observed_run
    outputs = torch.cat([o.reshape(-1) for o in kept["out"]])
    assert torch.isinf(outputs.half()).any()            # the layer really overflows FP16 ...
    assert not torch.isinf(outputs.bfloat16()).any()    # ... and not BF16
    assert report.verdict("pressure", "fp16") == "fp32"
    assert "overflow" in report.verdicts["pressure"]["fp16"].reason
    assert report.verdict("pressure", "bf16") == "ok"


def test_tiny_gradients_get_a_loss_scale_that_covers_them(observed_run):
    report, kept = observed_run
    threshold = report.settings.underflow_threshold
    grads = torch.cat([g.reshape(-1) for g in kept["grad"]])
    choice = report.loss_scale["fp16"]
    r = choice.recommended_log2
    assert report.verdict("body.0", "fp16") == "loss_scale"
    assert flushed_fraction(grads, 0) > 0.1                   # FP16 at scale 1 loses them: checked directly
    assert flushed_fraction(grads, r) <= threshold            # the recommended scale keeps them
    assert grads.abs().max().item() * 2.0**r < 65504          # without overflow
    # the analyzer's own number is the same exact count
    stats = report.layer("body.0").tensors["activation_grad"]
    assert stats.underflow_fraction(FormatLimits.of("fp16"), 0) == pytest.approx(flushed_fraction(grads, 0),
                                                                                 abs=1e-12)
    assert choice.min_log2 <= r <= choice.max_log2
    assert "pressure" in choice.unserved and "body.0" in choice.served
    assert report.verdict("body.0", "bf16") == "ok"


def test_fp8_recipe_is_derived_from_the_data(observed_run):
    report, _ = observed_run
    recipe = report.fp8
    assert set(recipe) == {"activation", "weight", "activation_grad", "weight_grad"}
    for kind, entry in recipe.items():
        assert set(entry["lost"]) == {"e4m3", "e5m2"}
        if entry["choice"] == "e4m3":
            assert entry["lost"]["e4m3"] <= report.settings.underflow_threshold
        elif entry["choice"] == "e5m2":
            assert entry["lost"]["e4m3"] > report.settings.underflow_threshold >= entry["lost"]["e5m2"]
    assert recipe["weight_grad"]["choice"] == "e5m2"     # the wide gradients need E5M2's range here


# ------------------------------------------- the loss-scale choice, on hand-made histograms
def layer_with_gradients(name: str, low: int, high: int) -> Layer:
    """A layer whose activation gradients fill binades low..high evenly (amax just below 2^(high+1))."""
    counts = np.zeros(254, dtype=np.int64)
    counts[low + 126:high + 127] = 1000
    hist = Log2Histogram(counts, np.zeros(254, dtype=np.int64))
    amax = float(2.0 ** (high + 1) * 0.99)
    return Layer(name, "Linear", {"activation_grad": TensorStats(name, "activation_grad", hist, amax, None, 1)})


def test_choose_loss_scale_serves_most_layers_and_names_the_rest():
    fp16 = FormatLimits.of("fp16")
    settings = Settings()
    layers = [layer_with_gradients("a", -30, -10), layer_with_gradients("b", -28, -5),
              layer_with_gradients("c", -60, 10)]     # c spans 71 binades: no scale serves it
    choice = choose_loss_scale(layers, fp16, settings)
    assert choice.unserved == ["c"]
    # a: its lowest binade 2^-30 must reach FP16's flush edge 2^-25 (s >= 5), its amax 0.99 * 2^-9 stay
    # below 65520 (s <= 24); b: s >= 3 and 0.99 * 2^-4 * 2^s < 65520 (s <= 20)
    assert (choice.min_log2, choice.max_log2) == (5, 20)
    assert choice.min_log2 <= choice.recommended_log2 <= min(choice.max_log2, choice.min_log2 + 8)
    assert choose_loss_scale([layer_with_gradients("x", -10, 0)], fp16, settings).recommended_log2 == 0


# ------------------------------------------- underflow that matters: the count and the norm it carries
def _gradient_stats(values: np.ndarray) -> TensorStats:
    from fpsim.analyze.effect import Mass
    from fpsim.analyze.histogram import Log2Counter

    counts, amax, mass = Log2Counter().count(torch.from_numpy(values), mass=True)
    return TensorStats("x", "weight_grad", Log2Histogram.from_raw(np.asarray(counts)), float(amax), None, 1,
                       mass=Mass.from_raw(np.asarray(mass)))


@pytest.mark.parametrize("base_log2, noise_log2, share, matters", [
    (-8, -40, 0.01, False), (-8, -40, 0.6, False), (-8, -27, 0.2, False),   # noise: many values, no norm
    (-20, -27, 0.2, True), (-22, -26, 0.01, True),                            # small values near the edge
    (-8, -27, 0.0005, False)])                                                # under the count threshold
def test_underflow_matters_when_the_flushed_values_add_more_error_than_one_rounding(base_log2, noise_log2, share,
                                                                                   matters):
    """A gradient of values near 2^base_log2 with `share` of them near 2^noise_log2 (below FP16's flush edge).
    Expected from fpsim.quantize alone: which values FP16 flushes, the share they are, and the relative L2
    error losing them adds, against FP16's unit roundoff 2^-11."""
    rng = np.random.default_rng(abs(noise_log2) + int(share * 1e4))
    n = 20_000
    values = (rng.standard_normal(n) * 2.0**base_log2).astype(np.float32)
    noisy = rng.random(n) < share
    values[noisy] = (rng.standard_normal(int(noisy.sum())) * 2.0**noise_log2).astype(np.float32)
    flushed = (np.asarray(fpsim.quantize(values, "fp16")) == 0) & (values != 0)
    exact = values.astype(np.float64)
    error = float(np.sqrt(np.square(exact[flushed]).sum() / np.square(exact).sum()))
    fp16, stats = FormatLimits.of("fp16"), _gradient_stats(values)
    assert stats.flush_error(fp16, 0) == pytest.approx(error, rel=1e-9)
    expected = flushed.sum() / (values != 0).sum() > 1e-3 and error > 2.0**-11
    assert bool(expected) is matters            # (the case is the one its parameters describe)
    assert stats.underflow_matters(fp16, 0, 1e-3) is bool(expected)
    assert stats.fits(fp16, 0, 1e-3) is not bool(expected)
