"""Effect-weighted statistics (fpsim.analyze.effect) against a direct numpy computation on the same tensors.

Source of truth: the values cast to each format by ml_dtypes (and numpy's own float16), independent of
fpsim's engine; the shares of sum |x| and sum x^2 of the values that flush to zero or overflow, and the
measured relative L2 rounding error of the values kept, computed with numpy on those casts.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from fpsim.analyze import watch
from fpsim.analyze.demo import SensorNet, sensor_data
from fpsim.analyze.effect import EFFECT_KEYS, Mass, effects
from fpsim.analyze.histogram import Log2Counter, Log2Histogram, kernel_available
from fpsim.analyze.limits import FormatLimits
from fpsim.analyze.verdicts import TensorStats

CASTS = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "e4m3": ml_dtypes.float8_e4m3fn,
         "e5m2": ml_dtypes.float8_e5m2}
SCALES = (-24, -8, 0, 6, 16, 30)


def spread_values(n: int, seed: int) -> np.ndarray:
    """float32 magnitudes log-uniform over 2^-40 .. 2^20 (every format flushes and overflows some at some
    scale), random signs, some exact powers of two (ties at the formats' zero thresholds), zeros and
    float32 subnormals."""
    rng = np.random.default_rng(seed)
    values = np.exp2(rng.uniform(-40, 20, size=n)) * rng.choice([-1.0, 1.0], size=n)
    powers = np.exp2(rng.integers(-40, 20, size=n // 50).astype(np.float64))
    return np.concatenate([values, powers, [0.0, -0.0, 2.0**-140, -(3 * 2.0**-145)]]).astype(np.float32)


def numpy_effect(values: np.ndarray, fmt: str, scale: int) -> dict:
    """The shares and the rounding error measured on the cast itself (x * 2^scale in float64, cast)."""
    x = values.astype(np.float64)
    x = x[np.isfinite(x)]
    scaled = x * 2.0**scale
    with np.errstate(over="ignore", invalid="ignore"):
        cast = scaled.astype(CASTS[fmt]).astype(np.float64)
    limit = float(ml_dtypes.finfo(CASTS[fmt]).max)
    flushed = (cast == 0) & (x != 0)
    over = ~np.isfinite(cast) | (np.abs(cast) > limit)
    kept = ~flushed & ~over
    l1, l2 = np.abs(x).sum(), (x * x).sum()
    error = np.sqrt((((cast - scaled)[kept]) ** 2).sum()) / (2.0**scale * math.sqrt(l2))
    return {"mass_lost_l1": np.abs(x[flushed]).sum() / l1, "mass_lost_l2": (x[flushed] ** 2).sum() / l2,
            "clipped_l1": np.abs(x[over]).sum() / l1, "clipped_l2": (x[over] ** 2).sum() / l2,
            "rounding_rel_error": error, "any_over": bool(over.any())}


def stats_of(values: np.ndarray, kernel: bool) -> TensorStats:
    counts, amax, mass = Log2Counter(kernel=kernel).count(torch.from_numpy(values), mass=True)
    return TensorStats("t", "activation_grad", Log2Histogram.from_raw(np.asarray(counts)), float(amax), None, 1,
                       mass=Mass.from_raw(np.asarray(mass)))


def binade_share_at_or_above(values: np.ndarray, e: int) -> tuple[float, float]:
    """Shares of sum |x| and sum x^2 of the values with |x| >= 2^e (numpy)."""
    x = np.abs(values.astype(np.float64))
    x = x[np.isfinite(x)]
    top = x >= 2.0**e
    return x[top].sum() / x.sum(), (x[top] ** 2).sum() / (x * x).sum()


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "torch"])
@pytest.mark.parametrize("fmt", list(CASTS))
def test_lost_and_clipped_shares_and_rounding_error_match_numpy(fmt, kernel):
    if kernel and not kernel_available():
        pytest.skip("the compiled kernel was not built")
    values = spread_values(60_000, 3)
    stats, lim = stats_of(values, kernel), FormatLimits.of(fmt)
    got = effects(stats.hist, stats.mass, lim, SCALES, [stats.overflows(lim, s) for s in SCALES])
    assert set(got) == set(EFFECT_KEYS)
    for i, s in enumerate(SCALES):
        want = numpy_effect(values, fmt, s)
        assert got["mass_lost_l1"][i] == pytest.approx(want["mass_lost_l1"], rel=1e-9, abs=1e-300)
        assert got["mass_lost_l2"][i] == pytest.approx(want["mass_lost_l2"], rel=1e-9, abs=1e-300)
        if not want["any_over"]:
            assert got["mass_clipped_l1"][i] == got["mass_clipped_l2"][i] == 0
        else:   # an upper bound: everything from the binade holding the threshold up
            bound_l1, bound_l2 = binade_share_at_or_above(values, lim.emax - s)
            assert want["clipped_l1"] <= got["mass_clipped_l1"][i] * (1 + 1e-9)
            assert want["clipped_l2"] <= got["mass_clipped_l2"][i] * (1 + 1e-9)
            assert got["mass_clipped_l1"][i] == pytest.approx(bound_l1, rel=1e-9)
            assert got["mass_clipped_l2"][i] == pytest.approx(bound_l2, rel=1e-9)
        # an expectation from the spacing: within 5% of the measured error of these random values; where
        # values overflow, the threshold's binade counts as kept, so it can only add
        if want["any_over"]:
            assert got["rounding_rel_error"][i] >= 0.95 * want["rounding_rel_error"], s
        else:
            assert got["rounding_rel_error"][i] == pytest.approx(want["rounding_rel_error"], rel=0.05), s


def test_no_mass_gives_nan_and_shares_do_not_depend_on_unaffected_scales():
    values = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    stats, lim = stats_of(values, kernel_available()), FormatLimits.of("bf16")
    none = effects(stats.hist, None, lim, [0, 1], [False, False])
    assert all(np.isnan(v).all() for v in none.values())
    got = effects(stats.hist, stats.mass, lim, [0, 1], [False, False])
    assert got["mass_lost_l1"].tolist() == [0.0, 0.0]            # bf16 keeps every normal float32 value
    # away from subnormals the relative rounding error is the format's: 2^-man_bits / sqrt(12), mantissas
    # uniform on the spacing, scale-free
    assert got["rounding_rel_error"][0] == pytest.approx(got["rounding_rel_error"][1], rel=1e-12)
    assert got["rounding_rel_error"][0] == pytest.approx(numpy_effect(values, "bf16", 0)["rounding_rel_error"],
                                                         rel=0.05)


def test_every_scale_and_format_at_once_equals_one_at_a_time():
    """The report asks for a hundred scales of every format in one call; the verdicts ask one scale at a time
    (checked against numpy and quantize above and in test_histogram). The two must agree exactly."""
    values = spread_values(20_000, 5)
    scales = list(range(-300, 301, 7)) + [-1100, 1100]
    cases = [stats_of(values, kernel_available()),
             stats_of(np.zeros(10, np.float32), kernel_available()),
             stats_of(np.array([1.0, np.inf, -3.0], np.float32), kernel_available()),
             stats_of(np.array([2.0**-140, np.nan, 5.0], np.float32), kernel_available())]
    limits = [FormatLimits.of(f) for f in ("fp16", "bf16", "e4m3", "e5m2", "e2m1", "fp32")]
    for stats in cases:
        for lim in limits:
            assert stats.overflows_at(lim, scales).tolist() == [stats.overflows(lim, s) for s in scales]
            np.testing.assert_array_equal(stats.underflow_fractions(lim, scales),
                                          [stats.underflow_fraction(lim, s) for s in scales])
        assert not stats.overflows_at(limits[0], [-1100, 0]).tolist()[0]
    stats, within = cases[0], scales[:-2]
    one_by_one = {lim: effects(stats.hist, stats.mass, lim, within, stats.overflows_at(lim, within))
                  for lim in limits}
    together = effects(stats.hist, stats.mass, [lim for lim in limits for _ in within], within * len(limits),
                       np.concatenate([stats.overflows_at(lim, within) for lim in limits]))
    for key in EFFECT_KEYS:
        np.testing.assert_array_equal(together[key], np.concatenate([one_by_one[lim][key] for lim in limits]))
    shares = effects(stats.hist, stats.mass, limits[0], within, False, rounding=False)
    assert set(shares) == set(EFFECT_KEYS) - {"rounding_rel_error"}
    np.testing.assert_array_equal(shares["mass_lost_l2"], effects(stats.hist, stats.mass, limits[0], within,
                                                                  False)["mass_lost_l2"])
    with pytest.raises(ValueError, match="format limits for"):
        effects(stats.hist, stats.mass, limits[:2], [0, 1, 2], False)


def test_report_json_carries_the_effect_of_the_observed_tensors():
    torch.manual_seed(0)
    data = sensor_data(samples=1024, seed=0)
    model = SensorNet(hidden=32, depth=3)
    layer = model.body[2]
    activations, grads = [], []
    hook = layer.register_forward_hook(lambda m, i, o: activations.append(o.detach().clone()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grab = opt.register_step_pre_hook(lambda o, a, k: grads.append(layer.weight.grad.detach().clone().ravel()))
    with watch(model, every=2, ops=False) as w:
        for step in range(4):
            i = torch.arange(step * 64, step * 64 + 64)
            loss = nn.functional.cross_entropy(model(data["readings"][i], data["pressure"][i]), data["label"][i])
            opt.zero_grad()
            loss.backward()
            opt.step()
    hook.remove()
    grab.remove()
    entry = next(e for e in w.report().to_dict()["layers"] if e["name"] == "body.2")
    observed = np.concatenate([a.numpy().ravel() for a in activations[0::2]])
    for fmt in CASTS:
        got, want = entry["tensors"]["activation"]["formats"][fmt], numpy_effect(observed, fmt, 0)
        assert got["mass_lost_l2"] == pytest.approx(want["mass_lost_l2"], rel=1e-9, abs=1e-300)
        assert got["rounding_rel_error"] == pytest.approx(want["rounding_rel_error"], rel=0.1)
    # the weight gradient's effect at every loss scale, as the optimizer's step saw it (no clipping here)
    by_scale = entry["tensors"]["weight_grad"]["effect_by_scale"]
    lo, hi = by_scale["log2_scales"]
    weight_grads = np.concatenate([g.numpy() for g in grads[0::2]])
    for s in (-16, 0, 12, 24):
        want = numpy_effect(weight_grads, "fp16", s)
        assert by_scale["fp16"]["mass_lost_l1"][s - lo] == pytest.approx(want["mass_lost_l1"], rel=1e-9,
                                                                         abs=1e-300)
    assert len(by_scale["fp16"]["rounding_rel_error"]) == hi - lo + 1
    assert "e4m3" not in by_scale     # per-tensor scaled: its effect at its own scale instead
    e4m3 = entry["tensors"]["weight_grad"]["formats"]["e4m3"]
    want = numpy_effect(weight_grads, "e4m3", e4m3["tensor_scale_log2"])
    assert e4m3["effect_at_tensor_scale"]["mass_lost_l2"] == pytest.approx(want["mass_lost_l2"], rel=1e-9,
                                                                           abs=1e-300)
    assert entry["tensors"]["update"]["formats"]["fp16"]["mass_lost_l1"] is None   # updates carry no mass
