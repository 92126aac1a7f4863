"""fpsim.formats: presets, aliases, custom layouts, derived properties.

Expected numbers come from the specifications (IEEE 754 binary formats, the
OCP 8-bit floating point specification for E4M3/E5M2, the OCP Microscaling
(MX) specification for E3M2, E2M3, E2M1 and E8M0, AMD/Graphcore FNUZ), from
ml_dtypes.finfo / numpy.finfo / torch.finfo, and from brute-force
enumeration of the codes with the exact oracle's decoder.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from functools import lru_cache

import ml_dtypes
import numpy as np
import pytest

from fpsim.formats import ALIASES, PRESETS, Format, format as get_format

from foundation_helpers import (CUSTOM_FORMATS, SMALL_PRESETS, fmt_id, oracle_decoded, oracle_finite_values, requires_torch,
                      torch)

F = Fraction
P2 = lambda e: Fraction(2) ** e  # noqa: E731

# name: (exp_bits, man_bits, bits, max, min_normal, min_subnormal, eps) from the specs
SPEC = {
    "fp64": (11, 52, 64, (2 - P2(-52)) * P2(1023), P2(-1022), P2(-1074), P2(-52)),
    "fp32": (8, 23, 32, (2 - P2(-23)) * P2(127), P2(-126), P2(-149), P2(-23)),
    "tf32": (8, 10, 19, (2 - P2(-10)) * P2(127), P2(-126), P2(-136), P2(-10)),
    "fp16": (5, 10, 16, F(65504), P2(-14), P2(-24), P2(-10)),
    "bf16": (8, 7, 16, (2 - P2(-7)) * P2(127), P2(-126), P2(-133), P2(-7)),
    "e4m3": (4, 3, 8, F(448), P2(-6), P2(-9), P2(-3)),          # OCP FP8 E4M3 (FN)
    "e5m2": (5, 2, 8, F(57344), P2(-14), P2(-16), P2(-2)),      # OCP FP8 E5M2
    "e4m3fnuz": (4, 3, 8, F(240), P2(-7), P2(-10), P2(-3)),     # bias 8, NaN at -0
    "e5m2fnuz": (5, 2, 8, F(57344), P2(-15), P2(-17), P2(-2)),  # bias 16, NaN at -0
    "e3m2": (3, 2, 6, F(28), P2(-2), P2(-4), P2(-2)),           # OCP MX FP6 E3M2
    "e2m3": (2, 3, 6, F(15, 2), F(1), P2(-3), P2(-3)),          # OCP MX FP6 E2M3
    "e2m1": (2, 1, 4, F(6), F(1), F(1, 2), F(1, 2)),            # OCP MX FP4 E2M1
    "e8m0": (8, 0, 8, P2(127), P2(-127), P2(-127), F(1)),       # OCP MX E8M0 scale
    # the other ml_dtypes types, from ml_dtypes.finfo (checked against it below)
    "e3m4": (3, 4, 8, F(31, 2), P2(-2), P2(-6), P2(-4)),        # float8_e3m4 (IEEE-like)
    "e4m3ieee": (4, 3, 8, F(240), P2(-6), P2(-9), P2(-3)),      # float8_e4m3 (IEEE-like)
    "e4m3b11fnuz": (4, 3, 8, F(30), P2(-10), P2(-13), P2(-3)),  # bias 11, NaN at -0
    "e5m3fnu": (5, 3, 8, F(114688), P2(-14), P2(-17), P2(-3)),  # unsigned, NaN all ones
}

# (normal_binades, subnormal_binades) by hand for the formats too big to enumerate
BIG_BINADES = {"fp64": (2046, 52), "fp32": (254, 23), "tf32": (254, 10)}

ML_DTYPES_NAMES = {
    "fp64": np.float64, "fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn, "e2m1": ml_dtypes.float4_e2m1fn,
    "e8m0": ml_dtypes.float8_e8m0fnu, "tf32": None,
    "e3m4": ml_dtypes.float8_e3m4, "e4m3ieee": ml_dtypes.float8_e4m3,
    "e4m3b11fnuz": ml_dtypes.float8_e4m3b11fnuz, "e5m3fnu": ml_dtypes.float8_e5m3fnu,
}
TORCH_NAMES = {
    "fp64": "float64", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
    "e5m2fnuz": "float8_e5m2fnuz", "e8m0": "float8_e8m0fnu",
    "e3m2": None, "e2m3": None, "e2m1": None, "tf32": None,
    "e3m4": None, "e4m3ieee": None, "e4m3b11fnuz": None, "e5m3fnu": None,
}


def test_preset_names_are_the_documented_ones():
    assert set(PRESETS) == set(SPEC)


def test_public_api_names():
    import fpsim
    from fpsim import blocks, codec, rounding

    # fpsim.format looks one level up (block formats too); element names give the plain Format
    assert fpsim.format is blocks.format and fpsim.Format is Format
    assert all(fpsim.format(name) is get_format(name) for name in PRESETS)
    assert fpsim.quantize is rounding.quantize
    assert fpsim.encode is codec.encode and fpsim.decode is codec.decode
    assert fpsim.format("E4M3") is PRESETS["e4m3"]


# ---------------------------------------------------------------- properties
@pytest.mark.parametrize("name", list(SPEC))
def test_preset_properties_match_the_specs(name):
    fmt = get_format(name)
    exp_bits, man_bits, bits, big, min_normal, min_sub, eps = SPEC[name]
    assert (fmt.exp_bits, fmt.man_bits, fmt.bits) == (exp_bits, man_bits, bits)
    assert fmt.max == big
    assert fmt.min_normal == min_normal
    assert fmt.min_subnormal == min_sub
    assert fmt.eps == eps
    assert fmt.precision == man_bits + 1


@pytest.mark.parametrize("name", [n for n, t in ML_DTYPES_NAMES.items() if t is not None])
def test_preset_properties_match_ml_dtypes_finfo(name):
    fmt = get_format(name)
    info = ml_dtypes.finfo(ML_DTYPES_NAMES[name])
    assert info.bits == fmt.bits
    assert info.nmant == fmt.man_bits
    assert info.nexp == fmt.exp_bits
    assert info.maxexp == fmt.emax + 1
    assert info.minexp == fmt.emin
    assert float(info.max) == float(fmt.max)
    assert float(info.smallest_normal) == float(fmt.min_normal)
    assert float(info.smallest_subnormal) == float(fmt.min_subnormal)
    assert float(info.eps) == float(fmt.eps)


@requires_torch
@pytest.mark.parametrize("name", [n for n, t in TORCH_NAMES.items() if t is not None])
def test_preset_properties_match_torch_finfo(name):
    fmt = get_format(name)
    info = torch.finfo(getattr(torch, TORCH_NAMES[name]))
    assert info.bits == fmt.bits
    assert info.max == float(fmt.max)
    assert info.tiny == float(fmt.min_normal)
    if name == "e5m2fnuz":
        # torch 2.x reports eps 0.125 for float8_e5m2fnuz, which has 2 mantissa bits
        # (eps 2^-2, as ml_dtypes.finfo and the layout say): a torch quirk, not ours.
        assert info.eps in (float(fmt.eps), 0.125)
    else:
        assert info.eps == float(fmt.eps)


@pytest.mark.parametrize("name", list(SPEC))
def test_ml_dtype_and_torch_dtype_bindings(name):
    fmt = get_format(name)
    assert fmt.ml_dtype is ML_DTYPES_NAMES[name]
    expected = getattr(torch, TORCH_NAMES[name]) if (torch is not None and TORCH_NAMES[name]) else None
    assert fmt.torch_dtype is expected


def test_custom_layout_equal_to_a_preset_gets_its_dtypes():
    same = Format(4, 3, nan="fn")
    assert same.ml_dtype is ml_dtypes.float8_e4m3fn
    different_bias = Format(4, 3, bias=6, nan="fn")
    assert different_bias.ml_dtype is None and different_bias.torch_dtype is None
    assert Format(4, 3, nan="fn", subnormals=False).ml_dtype is None


def _positive_values(fmt: Format) -> tuple:
    return tuple(v for v in oracle_finite_values(fmt) if v > 0)


def _binade(v: float) -> int:
    return math.frexp(v)[1] - 1  # exact: 2^binade <= v < 2^(binade+1)


@pytest.mark.parametrize("fmt", [get_format(n) for n in SMALL_PRESETS] + list(CUSTOM_FORMATS.values()),
                         ids=fmt_id)
def test_binades_count_the_binades_holding_values(fmt):
    positive = _positive_values(fmt)
    binades = {_binade(v) for v in positive}
    normal = {_binade(v) for v in positive if v >= fmt.min_normal}
    subnormal = {_binade(v) for v in positive if v < fmt.min_normal}
    assert fmt.binades == len(binades)
    assert fmt.normal_binades == len(normal)
    assert fmt.subnormal_binades == len(subnormal)
    # and the extreme values are the enumerated ones
    assert Fraction(positive[-1]) == fmt.max
    assert Fraction(positive[0]) == fmt.min_subnormal


@pytest.mark.parametrize("name", list(BIG_BINADES))
def test_binades_of_wide_formats(name):
    fmt = get_format(name)
    normal, subnormal = BIG_BINADES[name]
    assert (fmt.normal_binades, fmt.subnormal_binades, fmt.binades) == (normal, subnormal, normal + subnormal)


def test_e8m0_covers_2_to_minus_127_through_2_to_127():
    fmt = get_format("e8m0")
    positive = _positive_values(fmt)
    assert [Fraction(v) for v in positive] == [P2(e) for e in range(-127, 128)]
    assert not fmt.signed and not fmt.zero and not fmt.infinities and fmt.has_nan


@pytest.mark.parametrize("name,has_inf,has_nan,neg_zero", [
    ("fp16", True, True, True), ("bf16", True, True, True), ("e4m3", False, True, True),
    ("e5m2", True, True, True), ("e4m3fnuz", False, True, False), ("e5m2fnuz", False, True, False),
    ("e3m2", False, False, True), ("e2m3", False, False, True), ("e2m1", False, False, True),
    ("e8m0", False, True, False),
])
def test_special_value_rules(name, has_inf, has_nan, neg_zero):
    fmt = get_format(name)
    assert fmt.infinities is has_inf
    assert fmt.has_nan is has_nan
    assert fmt.has_negative_zero is neg_zero


# ------------------------------------------------------------------ lookup
ALIAS_EXPECTED = {
    "float64": "fp64", "double": "fp64", "float32": "fp32", "single": "fp32", "float16": "fp16",
    "half": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "e4m3fn": "e4m3",
    "float8_e5m2": "e5m2", "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
    "float6_e3m2fn": "e3m2", "float6_e2m3fn": "e2m3", "float4_e2m1fn": "e2m1",
    "float8_e8m0fnu": "e8m0", "tensorfloat32": "tf32",
}


@pytest.mark.parametrize("alias,preset", list(ALIAS_EXPECTED.items()))
def test_aliases(alias, preset):
    assert get_format(alias) is PRESETS[preset]
    assert get_format(alias.upper()) is PRESETS[preset]
    assert get_format(alias.title()) is PRESETS[preset]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_resolves_to_a_preset(alias):
    assert get_format(alias) is PRESETS[ALIASES[alias]]


@pytest.mark.parametrize("name", [n for n, t in ML_DTYPES_NAMES.items() if t is not None])
def test_ml_dtypes_spelling_names_the_same_layout(name):
    """The ml_dtypes/numpy dtype name of a preset is an alias of it (layout checked through finfo above)."""
    dtype_name = np.dtype(ML_DTYPES_NAMES[name]).name
    assert get_format(dtype_name) is PRESETS[name]


@requires_torch
@pytest.mark.parametrize("name", [n for n, t in TORCH_NAMES.items() if t is not None])
def test_torch_spelling_names_the_same_layout(name):
    dtype = getattr(torch, TORCH_NAMES[name])
    assert get_format(TORCH_NAMES[name]) is PRESETS[name]
    assert get_format(str(dtype)) is PRESETS[name]  # "torch.float8_e4m3fn"


@pytest.mark.parametrize("name", list(SPEC))
def test_names_are_case_insensitive(name):
    assert get_format(name.upper()) is PRESETS[name]


def test_format_passes_through():
    custom = Format(3, 3, nan="none")
    assert get_format(custom) is custom
    assert get_format(PRESETS["e4m3"]) is PRESETS["e4m3"]


@pytest.mark.parametrize("bad", ["e4m4", "fp8", "", "float8", "e4m3fnuzz"])
def test_unknown_name_raises_listing_allowed_names(bad):
    with pytest.raises(ValueError) as info:
        get_format(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in SPEC:
        assert name in message


@pytest.mark.parametrize("bad", [3, None, 1.5, b"e4m3", np.int8, np.dtype("int32"), int, object])
def test_non_string_name_raises_type_error(bad):
    with pytest.raises(TypeError, match="format"):
        get_format(bad)


DTYPE_OBJECTS = [
    (np.float64, "fp64"), (float, "fp64"), (np.dtype(">f4"), "fp32"), (np.dtype("float16"), "fp16"),
    (ml_dtypes.bfloat16, "bf16"), (np.dtype(ml_dtypes.float8_e4m3fn), "e4m3"), (ml_dtypes.float8_e5m2, "e5m2"),
    (ml_dtypes.float8_e4m3fnuz, "e4m3fnuz"), (ml_dtypes.float8_e5m2fnuz, "e5m2fnuz"),
    (ml_dtypes.float6_e3m2fn, "e3m2"), (ml_dtypes.float6_e2m3fn, "e2m3"), (ml_dtypes.float4_e2m1fn, "e2m1"),
    (ml_dtypes.float8_e8m0fnu, "e8m0"), (ml_dtypes.float8_e3m4, "e3m4"), (ml_dtypes.float8_e4m3, "e4m3ieee"),
    (ml_dtypes.float8_e4m3b11fnuz, "e4m3b11fnuz"), (ml_dtypes.float8_e5m3fnu, "e5m3fnu"),
]


@pytest.mark.parametrize("dtype,name", DTYPE_OBJECTS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_numpy_and_ml_dtypes_dtype_objects_name_their_format(dtype, name):
    fmt = get_format(dtype)
    assert fmt is PRESETS[name]
    if fmt.ml_dtype is not None:  # and the format is the dtype's own: same range and precision
        info = ml_dtypes.finfo(dtype)
        assert float(fmt.max) == float(info.max) and float(fmt.min_subnormal) == float(info.smallest_subnormal)


@requires_torch
def test_torch_dtypes_name_their_format():
    for name, torch_name in TORCH_NAMES.items():
        if torch_name is not None:
            assert get_format(getattr(torch, torch_name)) is PRESETS[name]
    assert get_format(torch.float4_e2m1fn_x2) is PRESETS["e2m1"]  # two E2M1 codes per byte
    with pytest.raises(TypeError, match="not a floating-point format"):
        get_format(torch.int8)


@pytest.mark.parametrize("field,value", [("exp_bits", "4"), ("exp_bits", 4.0), ("man_bits", None), ("bias", "7"),
                                         ("signed", 1), ("subnormals", "yes"), ("nan", 3), ("name", 5)])
def test_wrongly_typed_format_fields_name_the_field(field, value):
    args = dict(exp_bits=4, man_bits=3)
    args[field] = value
    with pytest.raises(TypeError, match=f"Format.{field} must be"):
        Format(**args)


# ------------------------------------------------------------ custom layouts
IMPOSSIBLE = {
    "infinities_with_fn": (dict(exp_bits=4, man_bits=3, nan="fn", infinities=True), "infinit"),
    "infinities_with_fnuz": (dict(exp_bits=4, man_bits=3, nan="fnuz", infinities=True), "infinit"),
    "infinities_with_none": (dict(exp_bits=4, man_bits=3, nan="none", infinities=True), "infinit"),
    "ieee_without_infinities": (dict(exp_bits=5, man_bits=2, nan="ieee", infinities=False), "infinit|ieee|IEEE"),
    "ieee_without_mantissa": (dict(exp_bits=5, man_bits=0, subnormals=False), "mantissa"),
    "ieee_one_exponent_bit": (dict(exp_bits=1, man_bits=3), "exponent"),
    "subnormals_without_zero": (dict(exp_bits=4, man_bits=3, nan="fn", zero=False), "subnormal"),
    "subnormals_without_mantissa": (dict(exp_bits=4, man_bits=0, nan="fn"), "subnormal"),
    "exp_bits_0": (dict(exp_bits=0, man_bits=3, nan="none"), "exp_bits"),
    "exp_bits_12": (dict(exp_bits=12, man_bits=3), "exp_bits"),
    "man_bits_53": (dict(exp_bits=5, man_bits=53), "man_bits"),
    "man_bits_negative": (dict(exp_bits=5, man_bits=-1), "man_bits"),
    "fnuz_unsigned": (dict(exp_bits=4, man_bits=3, bias=8, nan="fnuz", signed=False), "unsigned|sign"),
    "fnuz_without_zero": (dict(exp_bits=4, man_bits=3, nan="fnuz", subnormals=False, zero=False), "zero"),
    "max_beyond_fp64": (dict(exp_bits=11, man_bits=52, bias=1000), "binary64"),
    "tiny_beyond_fp64": (dict(exp_bits=11, man_bits=52, bias=1100), "binary64"),
}


@pytest.mark.parametrize("kwargs,why", list(IMPOSSIBLE.values()), ids=list(IMPOSSIBLE))
def test_impossible_formats_raise_value_error_saying_why(kwargs, why):
    with pytest.raises(ValueError, match=why):
        Format(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(exp_bits=2, man_bits=3, bias=-1100, nan="none"),
                                    dict(exp_bits=11, man_bits=10, bias=-1100)], ids=["e2m3", "e11m10"])
def test_range_far_beyond_fp64_raises_value_error(kwargs):
    with pytest.raises(ValueError, match="binary64"):
        Format(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(exp_bits=11, man_bits=52, bias=1024, subnormals=False, nan="fn"),
                                    dict(exp_bits=11, man_bits=52, bias=1023, signed=False, subnormals=False,
                                         zero=False)], ids=["e11m52fn_b1024", "e11m52u_nozero"])
def test_grid_finer_than_fp64_raises_value_error(kwargs):
    with pytest.raises(ValueError, match="binary64"):
        Format(**kwargs)


def test_unknown_nan_encoding_lists_allowed_with_explicit_name():
    with pytest.raises(ValueError) as info:
        Format(4, 3, nan="signalling", name="mine")
    for allowed in ("ieee", "fn", "fnuz", "none"):
        assert allowed in str(info.value)


def test_unknown_nan_encoding_lists_allowed():
    with pytest.raises(ValueError) as info:
        Format(4, 3, nan="signalling")
    for allowed in ("ieee", "fn", "fnuz", "none"):
        assert allowed in str(info.value)


@pytest.mark.parametrize("kwargs", [dict(exp_bits=4.0, man_bits=3), dict(exp_bits=True, man_bits=3),
                                    dict(exp_bits=4, man_bits=3, bias=7.0),
                                    dict(exp_bits=4, man_bits=3, signed=1, nan="fn")],
                         ids=["float_exp", "bool_exp", "float_bias", "int_signed"])
def test_wrongly_typed_fields_raise_type_error(kwargs):
    with pytest.raises(TypeError):
        Format(**kwargs)


def test_defaults_are_ieee():
    fmt = Format(5, 10)
    assert fmt.bias == 15 and fmt.infinities and fmt.nan == "ieee" and fmt.subnormals and fmt.zero and fmt.signed
    assert fmt.ml_dtype is np.float16
    assert Format(4, 3, nan="fn").infinities is False


def test_formats_are_frozen_and_hashable():
    fmt = Format(4, 3, nan="fn")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fmt.man_bits = 2  # type: ignore[misc]
    assert hash(fmt) == hash(Format(4, 3, nan="fn"))
    assert fmt == Format(4, 3, nan="fn")
    assert fmt != Format(4, 3, nan="fn", subnormals=False)


def test_extreme_valid_custom_formats():
    """The edges of the documented ranges are accepted and their properties follow the formulas."""
    wide = Format(11, 52, name="my64")
    assert wide.max == SPEC["fp64"][3] and wide.min_subnormal == P2(-1074)
    narrow = Format(1, 0, nan="none", subnormals=False)   # bias 0; values 0 and +-1.0 * 2^1 only
    assert narrow.max == 2 ** (1 - narrow.bias) and narrow.min_normal == narrow.max
    unsigned = Format(4, 3, signed=False, nan="fn")
    assert unsigned.bits == 7 and not unsigned.has_negative_zero


# --------------------------------------------------------------- contains
@lru_cache(maxsize=None)
def _value_set(fmt: Format) -> frozenset:
    """(value, sign of zero) for every finite value of a format of <= 16 bits, from the oracle's decoder."""
    decoded = oracle_decoded(fmt)
    return frozenset((float(v), math.copysign(1.0, v) if v == 0 else 1.0) for v in decoded if math.isfinite(v))

CONTAINER_CANDIDATES = (
    [get_format(n) for n in SMALL_PRESETS if get_format(n).bits <= 8]
    + [f for f in CUSTOM_FORMATS.values() if f.bits <= 8]
    + [get_format("fp16"), get_format("bf16")]
)


def _representable_in_big(fmt_name: str, values: frozenset) -> bool:
    """Membership by numpy casts: fp64 holds everything here; fp32 by round trip; tf32 also needs
    its low 13 mantissa bits clear."""
    for v, _ in values:
        if fmt_name == "fp64":
            continue
        f = np.float32(v)
        if float(f) != v or np.signbit(f) != np.signbit(v):
            return False
        if fmt_name == "tf32" and int(f.view(np.uint32)) & 0x1FFF:
            return False
    return True


@pytest.mark.parametrize("inner", CONTAINER_CANDIDATES, ids=fmt_id)
def test_contains_matches_brute_force(inner):
    inner_values = _value_set(inner)
    for outer in CONTAINER_CANDIDATES:
        expected = inner_values <= _value_set(outer)
        assert outer.contains(inner) is expected, f"{outer.name}.contains({inner.name})"
    for big in ("fp32", "fp64", "tf32"):
        expected = _representable_in_big(big, inner_values)
        assert get_format(big).contains(inner) is expected, f"{big}.contains({inner.name})"
