"""FP8 scaling recipes (fpsim.recipes) against TransformerEngine's definitions, restated exactly.

Sources of expected values:
- scales: TransformerEngine's formulas (recipe/__init__.py DelayedScaling and
  Float8CurrentScaling, pytorch/quantization.py _default_sf_compute and the
  amax-history update, common/recipe/recipe_common.cuh
  compute_scale_from_amax) computed here with Fractions and
  fpsim.exact.round_value for each FP32 rounding;
- elements: fpsim.exact.round_value of the exact product x * scale with
  saturation; dequantised values element * fl32(1 / scale), exact;
- block-wise recipes: the block formats, themselves held to the block
  oracle in tests/test_blocks.py.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fpsim
import fpsim.strategies as fst
from fpsim import exact
from fpsim.recipes import (RECIPES, BlockScaling, CurrentScaling, DelayedScaling, PerChannelScaling,
                           scale_from_amax)

DETERMINISTIC = ("nearest_even", "nearest_away", "toward_zero", "up", "down", "odd")
FP32_MAX = float(fpsim.format("fp32").max)


def fl32(v: Fraction) -> Fraction:
    return Fraction(exact.round_value(v, "fp32"))  # finite in these tests


def te_scale(amax: float, fmt, margin=0, previous=1.0) -> float:
    """(fp8_max / amax) / 2^margin in FP32; the previous scale for amax 0, Inf, NaN; FP32 max on overflow."""
    if not np.isfinite(amax) or amax <= 0:
        return previous
    s = exact.round_value(fpsim.format(fmt).max / Fraction(float(np.float32(amax))), "fp32")
    if np.isfinite(s):
        s = exact.round_value(Fraction(s) / 2**margin, "fp32")
    return FP32_MAX if np.isinf(s) else s


def expected(x, scale, fmt, rounding="nearest_even"):
    """element * fl32(1 / scale) for each x, element = fmt(x * scale) with saturation."""
    scale = np.broadcast_to(np.asarray(scale, dtype=np.float64), np.shape(x))
    out = np.empty(np.shape(x))
    for i in np.ndindex(out.shape):
        s = Fraction(float(scale[i]))
        v = float(x[i])
        product = v if v == 0 or not np.isfinite(v) else Fraction(v) * s
        element = exact.round_value(product, fmt, rounding, saturate=True)
        out[i] = element if element == 0 or not np.isfinite(element) else float(Fraction(element) * fl32(1 / s))
    return out


def assert_same(got, want):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), (got[~same][:5], want[~same][:5])


def scaled_ties(fmt="e4m3", dtype=np.float32):
    """Arrays whose products with their current-scaling scale sit on or next to the format's ties."""
    @st.composite
    def build(draw):
        amax = draw(st.sampled_from([1.0, 3.0, 448.0, 1e-3, 7e4, 2.0**-140, 3e38]) | st.floats(1e-30, 1e30))
        scale = te_scale(amax, fmt)
        ties = draw(hnp.arrays(np.float64, st.integers(1, 24), elements=fst.values(
            fpsim.Format(4, 4, bias=7, nan="none") if fmt == "e4m3" else fpsim.Format(5, 3),
            allow_nan=False, allow_infinity=False)))
        x = (ties / scale).astype(dtype)
        x = np.clip(x, -amax, amax).astype(dtype)
        return np.concatenate([x, np.array([amax], dtype=dtype)])
    return build()


# ------------------------------------------------------------------- scales
@pytest.mark.parametrize("amax", [1.0, 448.0, 3.0, 1e-3, 1e-38, 1e-45, 3e38, 0.0, np.inf, np.nan])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_scale_is_te_formula(amax, fmt):
    assert float(scale_from_amax(amax, fpsim.format(fmt))) == te_scale(amax, fmt)
    assert float(scale_from_amax(amax, fpsim.format(fmt), margin=2, previous=5.0)) == te_scale(amax, fmt, 2, 5.0)


def test_scale_power_of_two_and_epsilon():
    # TE compute_scale_from_amax: 448 / 3 = 149.33 -> mantissa cleared -> 128; amax below epsilon uses epsilon
    assert float(scale_from_amax(3.0, fpsim.format("e4m3"), power_of_two=True)) == 128.0
    assert float(scale_from_amax(1e-9, fpsim.format("e4m3"), epsilon=1e-3)) == te_scale(1e-3, "e4m3")
    assert float(scale_from_amax(1e-44, fpsim.format("e4m3"))) == FP32_MAX  # 448 / 1e-44 overflows FP32


@pytest.mark.parametrize("margin", [120, 127, 128, 135, 149, 200])
@pytest.mark.parametrize("amax", [3.0, 1e-30, 2.0**-140])
def test_scale_with_margins_beyond_fp32s_exponent_range(amax, margin):
    # 2^margin past FP32's range: the quotient still rounds once into FP32 (a subnormal, 0); power_of_two then
    # clears the mantissa bits of that float32, as TE's bit mask does (a subnormal scale becomes 0)
    fmt = fpsim.format("e4m3")
    want = np.float32(te_scale(amax, "e4m3", margin))
    got = scale_from_amax(amax, fmt, margin=margin)
    assert got.dtype == np.float32 and got == want
    pow2 = scale_from_amax(amax, fmt, margin=margin, power_of_two=True)
    assert pow2.dtype == np.float32 and pow2 == (want.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)


# --------------------------------------------------------------- delayed
def test_delayed_scaling_uses_earlier_amaxes():
    recipe = DelayedScaling("e4m3", amax_history_len=2)
    state = recipe.new_state()
    steps = [np.array([1.0, -2.0], np.float32), np.array([8.0, 1.0], np.float32),
             np.array([0.5, 0.25], np.float32), np.array([0.0, 0.0], np.float32)]
    history, scale = [], 1.0
    for x in steps:
        assert_same(recipe.quantize(x, state), expected(x, scale, "e4m3"))  # this step: the earlier scale
        history = (history + [float(np.max(np.abs(x)))])[-2:]
        scale = te_scale(max(history), "e4m3", previous=scale)
        assert float(state.scale) == scale and state.history == history
    # the history forgot 8.0 after two steps; then a zero amax keeps the scale
    assert state.history == [0.5, 0.0] and float(state.scale) == te_scale(0.5, "e4m3")


def test_delayed_scaling_nan_in_the_window_keeps_the_scale_wherever_it_sits():
    # TE takes the window's max with torch.max (NaN propagates) and keeps the scale for a non-finite amax;
    # Python's max() saw a NaN only in first place, so [1, nan, 4] took 4 and [nan, 1, 4] kept the scale
    def definition(fmt, amaxes, length):    # TE's _amax_and_scale_update, in exact arithmetic
        scale, window = Fraction(1), []
        for a in amaxes:
            window = (window + [a])[-length:]
            top = np.nan if any(np.isnan(window)) else max(window)
            if np.isfinite(top) and top > 0:
                scale = Fraction(float(np.float32(float(fpsim.format(fmt).max) / top)))
        return scale

    for fmt in ("e4m3", "e5m2"):
        for amaxes in ([1.0, np.nan, 4.0], [np.nan, 1.0, 4.0], [4.0, 1.0, np.nan], [np.nan, 2.0, 2.0, 2.0]):
            recipe = DelayedScaling(fmt, amax_history_len=3)
            state = recipe.new_state()
            for amax in amaxes:
                scale = recipe.record(state, amax)
            assert Fraction(float(scale)) == definition(fmt, amaxes, 3), (fmt, amaxes, scale)


def test_delayed_scaling_most_recent_and_margin():
    recipe = DelayedScaling("e5m2", margin=1, amax_history_len=16, amax_compute_algo="most_recent")
    state = recipe.new_state()
    recipe.record(state, 100.0)
    recipe.record(state, 3.0)
    assert float(state.scale) == te_scale(3.0, "e5m2", margin=1)
    recipe.record(state, np.inf)  # a non-finite amax keeps the previous scale
    assert float(state.scale) == te_scale(3.0, "e5m2", margin=1)


def test_hybrid_formats_for_gradients():
    # TE's HYBRID: E4M3 forward, E5M2 for gradients (scale 57344 / amax)
    x = np.array([3.0, 1e-3], np.float32)
    recipe = CurrentScaling("e4m3", gradient_format="e5m2")
    assert float(recipe.scale(x, kind="gradient")) == te_scale(3.0, "e5m2")
    assert_same(recipe.quantize(x, kind="gradient"), expected(x, te_scale(3.0, "e5m2"), "e5m2"))
    delayed = DelayedScaling(gradient_format="e5m2")
    state = delayed.new_state()
    delayed.quantize(x, state, kind="gradient")
    assert float(state.scale) == te_scale(3.0, "e5m2")


def test_delayed_scaling_overflows_when_the_tensor_grows():
    # the scale from a step with amax 7 saturates a step with amax 14 at 448 / scale
    recipe = DelayedScaling("e4m3")
    state = recipe.new_state()
    recipe.quantize(np.array([7.0], np.float32), state)
    y = recipe.quantize(np.array([14.0], np.float32), state)
    assert y[0] == float(Fraction(448) * fl32(1 / Fraction(float(np.float32(448) / np.float32(7)))))


# ---------------------------------------------------- current, per channel
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=scaled_ties(), rounding=st.sampled_from(DETERMINISTIC))
def test_current_scaling_rounds_the_exact_product(x, rounding):
    scale = te_scale(float(np.max(np.abs(x))), "e4m3")
    assert float(CurrentScaling().scale(x)) == scale
    assert_same(CurrentScaling().quantize(x, rounding=rounding), expected(x, scale, "e4m3", rounding))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(x=scaled_ties("e5m2", np.float64), rounding=st.sampled_from(DETERMINISTIC))
def test_current_scaling_of_float64_input(x, rounding):
    scale = te_scale(float(np.max(np.abs(x))), "e5m2")
    assert_same(CurrentScaling("e5m2").quantize(x, rounding=rounding), expected(x, scale, "e5m2", rounding))


def test_per_channel_scaling_is_current_scaling_per_row():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((5, 12)) * np.exp2(rng.integers(-8, 8, (5, 1)))).astype(np.float32)
    w[3] = 0.0  # a zero row keeps the scale 1
    recipe = PerChannelScaling("e4m3")
    scales = recipe.scale(w)
    assert scales.shape == (5, 1) and float(scales[3, 0]) == 1.0
    for row in range(5):
        assert float(scales[row, 0]) == te_scale(float(np.max(np.abs(w[row]))), "e4m3")
    assert_same(recipe.quantize(w), expected(w, scales, "e4m3"))
    assert PerChannelScaling(axis=0).scale(w).shape == (1, 12)


def test_block_scaling_uses_the_block_formats():
    x = (np.random.default_rng(1).standard_normal((130, 260)) * 0.1).astype(np.float32)
    recipe = BlockScaling()
    assert_same(recipe.quantize(x, kind="weight"), fpsim.quantize(x, "fp8_block_128x128"))
    assert_same(recipe.quantize(x), fpsim.quantize(x, "fp8_block_1x128"))
    assert_same(BlockScaling(weights="mxfp8_e4m3").quantize(x, kind="weight"), fpsim.quantize(x, "mxfp8_e4m3"))


def test_stochastic_rounding_picks_a_neighbour():
    x = np.full(20001, 1.3, dtype=np.float32)
    x[0] = 2.0  # the amax: scale = fl32(448 / 2) = 224, and 1.3 * 224 = 291.2 lies between 288 and 320
    scale = te_scale(2.0, "e4m3")
    down = expected(x[1:2], scale, "e4m3", "toward_zero")[0]
    up = expected(x[1:2], scale, "e4m3", "up")[0]
    y = CurrentScaling().quantize(x, rounding="stochastic", seed=1)[1:]
    assert set(np.unique(y).tolist()) == {down, up}
    p = float((Fraction(float(x[1])) * 224 - 288) / 32)
    assert abs(np.mean(y == up) - p) < 5 * (p * (1 - p) / y.size) ** 0.5


# ------------------------------------------------------------------ torch
def test_numpy_and_torch_alike():
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(2).standard_normal((4, 256)) * 3).astype(np.float32)
    for recipe in (CurrentScaling(), PerChannelScaling(), BlockScaling()):
        t = recipe.quantize(torch.from_numpy(x))
        assert isinstance(t, torch.Tensor)
        assert_same(t.numpy(), recipe.quantize(x))
    state_np, state_t = DelayedScaling().new_state(), DelayedScaling().new_state()
    for _ in range(2):
        assert_same(DelayedScaling().quantize(torch.from_numpy(x), state_t).numpy(),
                    DelayedScaling().quantize(x, state_np))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="amax_compute_algo must be 'max' or 'most_recent'"):
        DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="margin must be an int >= 0"):
        DelayedScaling(margin=-1)
    with pytest.raises(TypeError, match="needs the recipe's state"):
        DelayedScaling().quantize(np.ones(3, np.float32), None)
    with pytest.raises(TypeError, match="not the block format mxfp4"):
        CurrentScaling("mxfp4")
    with pytest.raises(TypeError, match="must be a block format"):
        BlockScaling(weights="e4m3")
    with pytest.raises(ValueError, match="unknown tensor kind 'bias'"):
        BlockScaling().quantize(np.ones(4, np.float32), kind="bias")
    with pytest.raises(ValueError, match="unknown tensor kind 'bias'"):
        CurrentScaling().quantize(np.ones(4, np.float32), kind="bias")
    with pytest.raises(ValueError, match="axis=2 is out of range"):
        PerChannelScaling(axis=2).scale(np.ones((2, 2), np.float32))
    assert set(RECIPES) == {"delayed", "current", "per_channel", "block"}


BAD_ARGUMENTS = [   # (argument, value, error, message): refused alike by every recipe class that takes it
    ("power_of_two", "no", TypeError, "power_of_two must be True or False, got str 'no'"),
    ("power_of_two", 1, TypeError, "power_of_two must be True or False, got int 1"),
    ("amax_epsilon", -1.0, ValueError, "amax_epsilon must be a finite number >= 0, got -1.0"),
    ("amax_epsilon", float("nan"), ValueError, "amax_epsilon must be a finite number >= 0, got nan"),
    ("amax_epsilon", "x", TypeError, "amax_epsilon must be a real number >= 0, got str 'x'"),
    ("axis", 1.5, TypeError, "axis must be an int, got float 1.5"),
    ("axis", "-1", TypeError, "axis must be an int, got str '-1'"),
    ("margin", 1.0, TypeError, "margin must be an int >= 0, got float 1.0"),
    ("amax_history_len", 0, ValueError, "amax_history_len must be an int >= 1, got 0"),
    ("format", "e8m0", ValueError, "format='e8m0' is unsigned.*allowed: .*e4m3, e5m2"),
    ("gradient_format", "e5m3fnu", ValueError, "gradient_format='e5m3fnu' is unsigned.*allowed: .*e4m3, e5m2"),
]


@pytest.mark.parametrize("cls, argument, value, error, message", [
    pytest.param(cls, *bad, id=f"{cls.__name__}-{bad[0]}={bad[1]!r}")
    for cls in (DelayedScaling, CurrentScaling, PerChannelScaling) for bad in BAD_ARGUMENTS
    if bad[0] in {f.name for f in dataclasses.fields(cls)}])
def test_every_recipe_refuses_a_bad_argument_when_it_is_made(cls, argument, value, error, message):
    # DESIGN.md: bad input fails fast, naming the value and what is allowed; a recipe made with it quantised
    # wrongly or failed later (CurrentScaling(power_of_two="no") scaled by 128 instead of fl32(448 / 3))
    with pytest.raises(error, match=f"{cls.__name__}: {message}"):
        cls(**{argument: value})


def test_power_of_two_and_epsilon_as_te_defines_them():
    # TE compute_scale_from_amax, by hand: amax 3 -> fl32(448 / 3); power_2_scale keeps the largest power
    # of two not above it (the mantissa bits cleared): 128; amax_epsilon raises an amax below it
    x = np.array([1.5, -3.0, 0.7], np.float32)
    plain = Fraction(te_scale(3.0, "e4m3"))
    power = Fraction(1)
    while power * 2 <= plain:
        power *= 2
    assert power == 128 and plain != 128
    assert Fraction(float(CurrentScaling(power_of_two=False).scale(x))) == plain
    assert Fraction(float(CurrentScaling(power_of_two=True).scale(x))) == power
    assert Fraction(float(CurrentScaling(power_of_two=np.True_).scale(x))) == power
    assert Fraction(float(PerChannelScaling(power_of_two=True).scale(x[None])[0, 0])) == power
    assert float(CurrentScaling(amax_epsilon=8.0).scale(x)) == te_scale(8.0, "e4m3")   # 448 / 8 = 56
    assert PerChannelScaling(axis=np.int64(0)).scale(np.ones((2, 3), np.float32)).shape == (1, 3)
    with pytest.raises(TypeError, match="scale_from_amax: power_of_two must be True or False, got str 'no'"):
        scale_from_amax(3.0, fpsim.format("e4m3"), power_of_two="no")
    with pytest.raises(ValueError, match="scale_from_amax: epsilon must be a finite number >= 0, got -1.0"):
        scale_from_amax(3.0, fpsim.format("e4m3"), epsilon=-1.0)


@pytest.mark.parametrize("recipe", [CurrentScaling("e4m3"), PerChannelScaling("e4m3"), DelayedScaling("e4m3"),
                                    CurrentScaling("e5m2")], ids=lambda r: f"{r.name}-{r.format.name}")
def test_nan_passes_through_the_recipes(recipe):
    # a NaN makes the amax NaN, so the scale is kept (1 at first) and the NaN stays NaN in a format with
    # NaN; E4M3 raised instead (the decision-point check used a finer format without NaN)
    x = np.array([[np.nan, 1.0, -3.0, 0.5]], dtype=np.float32)
    args = (recipe.new_state(),) if isinstance(recipe, DelayedScaling) else ()
    got = recipe.quantize(x, *args)
    assert np.isnan(got[0, 0])
    assert got[0, 1:].tolist() == [exact.round_value(float(v), recipe.format) for v in x[0, 1:]]


@pytest.mark.parametrize("recipe", [DelayedScaling("e4m3"), CurrentScaling("e5m2"), PerChannelScaling("e4m3"),
                                    BlockScaling()], ids=lambda r: r.name)
def test_tensors_that_record_gradients_get_the_straight_through_gradient(recipe):
    # fake quantisation: the values of the detached tensor; backward passes the gradient through unchanged,
    # in the input's dtype (the straight-through estimator, Bengio et al. 2013); none under no_grad
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(0), requires_grad=True)
    state = recipe.new_state() if isinstance(recipe, DelayedScaling) else None
    want = recipe.quantize(x.detach().clone(), recipe.new_state() if state is not None else None)
    y = recipe.quantize(x, state)
    assert y.requires_grad and torch.equal(y.detach(), want)
    upstream = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
    y.backward(upstream)
    assert x.grad.dtype == x.dtype and torch.equal(x.grad, upstream.to(x.dtype))
    with torch.no_grad():
        assert not recipe.quantize(x, state).requires_grad
