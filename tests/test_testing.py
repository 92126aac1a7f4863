"""fpsim.testing: the assertion helpers and ulp, against hand-made cases and the Fraction oracle;
which specials a format has from ml_dtypes' round trips, integer exactness from Python's exact
int/float comparison, spacings from math.ulp."""

from __future__ import annotations

import importlib
import inspect
import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import fpsim
from fpsim import exact
from fpsim.formats import Format
from fpsim.testing import MAX_REPORTED, assert_bitwise_equal, assert_within_ulps, ulp


def message(call) -> str:
    with pytest.raises(AssertionError) as info:
        call()
    return str(info.value)


# ----------------------------------------------------- assert_bitwise_equal
def test_equal_arrays_pass_nan_included():
    x = np.array([1.0, -0.0, np.nan, np.inf, -2.5], dtype=np.float32)
    assert_bitwise_equal(x, x.copy())
    assert_bitwise_equal(x, x.astype(np.float64))  # the same values in another dtype
    assert_bitwise_equal(torch.from_numpy(x), x)
    assert_bitwise_equal(np.float32(1.5), 1.5)
    assert_bitwise_equal(np.array([0.0, 0.0]), 0.0)  # a scalar against every element


def test_signed_zeros_differ_and_the_message_shows_bits():
    text = message(lambda: assert_bitwise_equal(np.array([1.0, -0.0], dtype=np.float32), np.array([1.0, 0.0])))
    assert "1 of 2 elements differ" in text
    assert "at (1,): actual 0x80000000 (-0.0) [float32], desired 0x0000000000000000 (0.0) [float64]" in text


def test_nan_signs_are_ignored_unless_asked():
    a, b = np.array([np.nan]), np.array([-np.nan])
    assert_bitwise_equal(a, b)
    text = message(lambda: assert_bitwise_equal(a, b, check_nan_sign=True))
    assert "actual 0x7ff8000000000000 (nan)" in text and "desired 0xfff8000000000000 (-nan)" in text
    # fnuz formats have one NaN: its sign never counts
    assert_bitwise_equal(a, b, "e4m3fnuz", check_nan_sign=True)
    assert "0xff (-nan)" in message(lambda: assert_bitwise_equal(a, b, "e4m3", check_nan_sign=True))


def test_nan_against_a_number_fails():
    text = message(lambda: assert_bitwise_equal(np.array([np.nan, 1.0]), np.array([0.0, 1.0]), "e4m3"))
    assert "at (0,): actual 0x7f (nan), desired 0x00 (0.0)" in text


def test_in_a_format_bits_are_that_formats_codes():
    x = np.array([1.0625, 3.0], dtype=np.float32)
    got = np.array([1.125, 3.0], dtype=np.float32)
    text = message(lambda: assert_bitwise_equal(got, x, fmt="e4m3"))
    assert text.splitlines() == [
        "Not bitwise equal in e4m3: 1 of 2 elements differ",
        "  at (0,): actual 0x39 (1.125), desired 1.0625 (0x3f880000 as float32; not a value of e4m3)",
    ]


def test_values_outside_the_format_fail_even_when_equal():
    x = np.array([1.3])
    assert "not a value of e4m3" in message(lambda: assert_bitwise_equal(x, x, "e4m3"))
    assert "not a value of e4m3fnuz" in message(lambda: assert_bitwise_equal(-0.0, -0.0, "e4m3fnuz"))
    assert "not a value of e8m0" in message(lambda: assert_bitwise_equal(0.0, 0.0, "e8m0"))
    assert "not a value of e2m1" in message(lambda: assert_bitwise_equal(np.nan, np.nan, "e2m1"))


ML_DTYPES_OF = {"e2m1": ml_dtypes.float4_e2m1fn, "e3m2": ml_dtypes.float6_e3m2fn, "e2m3": ml_dtypes.float6_e2m3fn,
                "e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
                "e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "e8m0": ml_dtypes.float8_e8m0fnu, "bf16": ml_dtypes.bfloat16,
                "fp16": np.float16}


def test_nan_and_inf_are_values_only_of_formats_that_have_them():
    """docs/testing.md: with fmt, both sides must hold values of the format. Whether NaN and +-Inf are
    values of it is ml_dtypes' (numpy's for fp16) round trip: a format without NaN (e2m1, e3m2, e2m3)
    turns NaN into a number, one without infinities turns Inf into NaN or max."""
    refused = []
    for name, dtype in ML_DTYPES_OF.items():
        for special in (math.nan, math.inf, -math.inf):
            x = np.array([special], dtype=np.float32)
            back = x.astype(dtype).astype(np.float64)
            held = bool(np.isnan(back[0])) if math.isnan(special) else bool(back[0] == special)
            if held:
                assert_bitwise_equal(x, x, name)
            else:
                text = message(lambda: assert_bitwise_equal(x, x, name))
                assert f"actual {special!r} (0x{x.view(np.uint32)[0]:08x} as float32; not a value of {name})" in text
                refused.append((name, special))
    assert ("e2m1", math.nan) in refused and ("e4m3", math.inf) in refused  # the oracle is not vacuous


def test_integer_arrays_are_codes_when_a_format_is_given():
    codes = np.array([0x38, 0x7F, 0x80], dtype=np.uint8)
    assert_bitwise_equal(codes, np.array([1.0, np.nan, -0.0]), "e4m3")
    assert_bitwise_equal(codes, fpsim.encode(np.array([1.0, np.nan, -0.0], dtype=np.float32), "e4m3"), "e4m3")
    text = message(lambda: assert_bitwise_equal(np.array([0x39], dtype=np.uint8), np.array([0x38]), "e4m3"))
    assert "actual 0x39 (1.125), desired 0x38 (1.0)" in text
    # NaN codes of either sign are both NaN; with check_nan_sign they differ
    assert_bitwise_equal(np.array([0x7F]), np.array([0xFF]), "e4m3")
    assert "differ" in message(lambda: assert_bitwise_equal(np.array([0x7F]), np.array([0xFF]), "e4m3",
                                                             check_nan_sign=True))
    with pytest.raises(ValueError, match="outside 0..255"):
        assert_bitwise_equal(np.array([256]), np.array([0]), "e4m3")
    assert_bitwise_equal(3, 3.0, "e4m3")  # a Python int is a value, not a code


def test_torch_and_ml_dtypes_inputs_show_their_own_bits():
    a = torch.tensor([1.5], dtype=torch.bfloat16)
    b = np.array([1.5078125], dtype=ml_dtypes.bfloat16)
    assert "actual 0x3fc0 (1.5) [bfloat16], desired 0x3fc1 (1.5078125) [bfloat16]" in message(
        lambda: assert_bitwise_equal(a, b))
    f8 = torch.tensor([448.0], dtype=torch.float8_e4m3fn)
    assert_bitwise_equal(f8, np.array([448.0], dtype=ml_dtypes.float8_e4m3fn), "e4m3")
    assert "actual 0x7e (448.0)" in message(lambda: assert_bitwise_equal(f8, 416.0, "e4m3"))


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="torch without float4_e2m1fn_x2")
def test_packed_fp4_tensors_compare_as_their_codes():
    """torch.float4_e2m1fn_x2 holds two E2M1 codes a byte, the first in the low nibble (PyTorch's packing, as
    fpsim.decode's docstring says); the codes' values from ml_dtypes.float4_e2m1fn (one code a byte)."""
    packed = torch.tensor([[0x12, 0xF0]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    codes = np.array([[0x2, 0x1, 0x0, 0xF]], dtype=np.uint8)
    assert_bitwise_equal(packed, codes.view(ml_dtypes.float4_e2m1fn), "e2m1")
    assert_bitwise_equal(packed, codes.view(ml_dtypes.float4_e2m1fn))
    assert_bitwise_equal(packed, codes, "e2m1")
    other = torch.tensor([[0x32, 0xF0]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    assert "at (0, 1): actual 0x1 (0.5), desired 0x3 (1.5)" in message(lambda: assert_bitwise_equal(packed, other))
    with pytest.raises(ValueError, match="4-bit codes"):
        assert_bitwise_equal(packed, codes, "e4m3")


def test_at_most_five_mismatches_are_listed_with_the_count():
    text = message(lambda: assert_bitwise_equal(np.arange(10.0).reshape(2, 5), np.zeros((2, 5)), err_msg="ctx"))
    lines = text.splitlines()
    assert lines[0] == "ctx"
    assert lines[1] == f"Not bitwise equal: 9 of 10 elements differ (first {MAX_REPORTED} shown)"
    assert len(lines) == 2 + MAX_REPORTED and lines[2].startswith("  at (0, 1): ")


@pytest.mark.parametrize("n", [2**53 + 1, -(2**53 + 1), 2**53 + 3, 2**62 + 1, 2**63 - 1])
def test_integers_float64_does_not_hold_are_refused_not_rounded(n):
    """Integers are compared as float64 values; one that float64 does not hold exactly must be refused
    (as a Python int always was), never rounded into a pass against its neighbour. Exactness is
    Python's own exact int/float comparison."""
    assert float(n) != n  # not a float64: it would round to float(n), 1 away
    pattern = rf"{abs(n)} is not exactly a float64"
    for x in (np.array([n], dtype=np.int64), np.array([[0, n]], dtype=np.int64), torch.tensor([n], dtype=torch.int64),
              np.array([n], dtype=object), n):
        with pytest.raises(ValueError, match=pattern):
            assert_bitwise_equal(x, float(n))
        with pytest.raises(ValueError, match=pattern):
            assert_bitwise_equal(float(n), x)
        with pytest.raises(ValueError, match=pattern):
            assert_within_ulps(x, float(n), "fp64", 0)


def test_integers_float64_holds_compare_as_their_values():
    for n in (2**53, 2**53 + 2, -(2**62), -(2**63), 2**62 + 2**10):
        assert float(n) == n  # exactly a float64 (Python's exact int/float comparison)
        for x in (np.array([n], dtype=np.int64), torch.tensor([n], dtype=torch.int64), np.array([n], dtype=object)):
            assert_bitwise_equal(x, float(n))
            assert_within_ulps(x, float(n), "fp64", 0)
        assert "1 of 1 elements differ" in message(lambda: assert_bitwise_equal(np.array([n]), float(n) * 2))
    big = np.array([2**64 - 2**11], dtype=np.uint64)  # exactly a float64, beyond int64
    assert_bitwise_equal(big, float(2**64 - 2**11))
    with pytest.raises(ValueError, match="is not exactly a float64"):
        assert_bitwise_equal(np.array([2**64 - 1], dtype=np.uint64), 2.0**64)


def test_shape_mismatch_and_bad_inputs():
    assert "shapes differ" in message(lambda: assert_bitwise_equal(np.zeros(2), np.zeros(3)))
    with pytest.raises(TypeError):
        assert_bitwise_equal(np.array([True]), np.array([True]))
    with pytest.raises(TypeError):
        assert_bitwise_equal(np.array([1j]), np.array([1j]))


@settings(max_examples=50, deadline=None)
@given(st.sampled_from(["e4m3", "e5m2", "e2m1", "e8m0", "e4m3fnuz", "fp16"]), st.data())
def test_values_and_their_codes_compare_equal(name, data):
    fmt = fpsim.format(name)
    code = data.draw(st.integers(0, 2**fmt.bits - 1))
    value = exact.decode_code(code, fmt)
    if math.isnan(value):  # the NaN's sign is the code's sign bit
        value = math.copysign(math.nan, -1.0 if fmt.signed and code >> (fmt.bits - 1) else 1.0)
    assert_bitwise_equal(np.array([value]), np.array([value]), fmt)
    canonical = exact.encode_value(value, fmt) if not math.isnan(value) else code
    assert_bitwise_equal(np.array([canonical], dtype=np.uint32), np.array([value]), fmt, check_nan_sign=True)


# ----------------------------------------------------------------------- ulp
def test_ulp_at_powers_of_two_zero_and_the_subnormal_range():
    e4m3 = fpsim.format("e4m3")
    assert ulp(1.0, e4m3) == 0.125  # the gap above 1 (the gap below is 0.0625)
    assert ulp(np.nextafter(1.0, 0), e4m3) == 0.0625
    assert ulp(0.0, e4m3) == ulp(-0.0, e4m3) == 2.0**-9 == float(e4m3.min_subnormal)
    assert ulp(2.0**-6, e4m3) == ulp(2.0**-8, e4m3) == 2.0**-9  # min normal and subnormals share it
    assert ulp(448.0, e4m3) == 32.0 and ulp(1000.0, e4m3) == 64.0  # beyond max: unbounded exponent
    nosub = Format(4, 3, nan="fn", subnormals=False)
    assert ulp(0.0, nosub) == ulp(2.0**-8, nosub) == 2.0**-6 == float(nosub.min_normal)
    assert ulp(1.0, "e8m0") == 1.0 and ulp(0.0, "e8m0") == 2.0**-127
    assert math.isnan(ulp(math.inf, "fp16")) and math.isnan(ulp(math.nan, "fp16"))


def test_ulp_types():
    assert isinstance(ulp(1.0, "fp16"), float)
    arr = ulp(np.array([1.0, 2.0], dtype=np.float32), "fp16")
    assert arr.dtype == np.float64 and arr.tolist() == [2.0**-10, 2.0**-9]
    t = ulp(torch.tensor([1.0, 2.0]), "bf16")
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.tolist() == [2.0**-7, 2.0**-6]


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e2m1", "e3m2", "e8m0", "e5m2fnuz", "fp16"])
def test_ulp_is_the_oracles_quantum_everywhere(name):
    fmt = fpsim.format(name)
    vals = np.array([v for v in exact.all_values(fmt) if v > 0])[:: 1 if fmt.bits <= 8 else 37]
    mids = (vals[:-1] + vals[1:]) / 2
    for x in np.concatenate([vals, mids, -vals]):
        assert ulp(float(x), fmt) == float(exact.quantum(fmt, abs(Fraction(float(x))))), x


def test_ulp_of_integers_is_their_binades_spacing():
    """ulp of an integer that float64 does not hold is the spacing of the binade the integer lies in, not
    of the power of two it would round to (2^54 - 1 rounds up to 2^54, a binade higher). The spacing
    is math.ulp of a float64 in the same binade: 2^floor(log2 |n|)."""
    for n in (2**54 - 1, 2**54 + 1, 2**60 - 1, 2**63 - 1, -(2**63 - 1), 2**64 - 1):
        want = math.ulp(float(2 ** (abs(n).bit_length() - 1)))
        if n < 2**63:
            assert ulp(np.array([n], dtype=np.int64), "fp64")[0] == want
            assert ulp(torch.tensor([n], dtype=torch.int64), "fp64").item() == want
        if n > 0:
            assert ulp(np.array([n], dtype=np.uint64), "fp64")[0] == want
        assert ulp(n, "fp64") == want
        assert ulp(np.array([Fraction(n)], dtype=object), "fp64")[0] == want


# ---------------------------------------------------------- assert_within_ulps
def test_within_ulps_passes_and_fails_at_the_limit():
    assert_within_ulps(np.array([1.0625, 1.0]), np.array([1.0, 1.0]), "e4m3", 0.5)
    text = message(lambda: assert_within_ulps(np.array([1.125]), np.array([1.0]), "e4m3", 0.5))
    assert text.splitlines() == [
        "Not within 0.5 ulps of e4m3: 1 of 1 elements differ",
        "  at (0,): actual 0x39 (1.125), desired 0x38 (1.0): error 1 ulps (ulp 0.125 in e4m3)",
    ]


def test_within_ulps_is_exact_where_float64_subtraction_rounds():
    # 2^60 + 2^8 - 2^-60: the float64 difference rounds, the exact one is just inside or outside
    big, small = 2.0**60, 2.0**-60
    fmt = fpsim.format("fp64")
    assert_within_ulps(np.array([big + 256.0]), np.array([big]), fmt, 1)  # ulp(2^60) = 256: exactly 1 ulp
    assert "error" in message(lambda: assert_within_ulps(np.array([big + 512.0]), np.array([big]), fmt, 1.5))
    assert_within_ulps(np.array([small]), np.array([-small]), Format(11, 52, bias=1023), 2**53)


def test_within_ulps_specials():
    assert_within_ulps(np.array([np.nan, np.inf, -0.0]), np.array([np.nan, np.inf, 0.0]), "fp16", 0)
    assert "not finite" in message(lambda: assert_within_ulps(np.array([np.inf]), np.array([65504.0]), "fp16", 10))
    assert "not finite" in message(lambda: assert_within_ulps(np.array([np.nan]), np.array([1.0]), "fp16", 10))
    with pytest.raises(ValueError):
        assert_within_ulps(1.0, 1.0, "fp16", -1)


@pytest.mark.parametrize("desired", [math.inf, -math.inf, math.nan])
def test_within_ulps_reports_the_ulp_of_a_non_finite_reference_as_ulp_gives_it(desired):
    """The message's ulp is ulp(desired, fmt), which is NaN for Inf and NaN (docs/testing.md)."""
    spacing = ulp(desired, "e5m2")
    assert math.isnan(spacing)
    text = message(lambda: assert_within_ulps(np.array([1.0]), np.array([desired]), "e5m2", 1))
    assert text.endswith(f": error not finite (ulp {spacing!r} in e5m2)"), text


def test_within_ulps_reports_values_off_the_grid_in_their_dtype():
    text = message(lambda: assert_within_ulps(np.array([1.3], dtype=np.float32), np.array([1.0]), "e4m3", 1))
    assert "actual 0x3fa66666 (1.2999999523162842) [float32], desired 0x38 (1.0)" in text
    assert "error 2.4 ulps" in text


def test_helpers_work_without_hypothesis_imported():
    import sys

    import fpsim.testing as testing

    assert "hypothesis" not in testing.__dict__ and callable(testing.ulp)
    assert sys.modules["fpsim.testing"] is testing


def test_inputs_are_reported_exactly():
    x = np.array([2.0**-10, 1.0], dtype=np.float32)
    text = message(lambda: assert_bitwise_equal(np.array([2.0**-9, 1.0]), fpsim.quantize(x, "e4m3"), "e4m3", inputs=x))
    assert "at (0,): input 0x3a800000 (0.0009765625) [float32]: actual 0x01 (0.001953125), desired 0x00 (0.0)" in text
    text = message(lambda: assert_within_ulps(np.array([2.0]), np.array([1.0]), "e4m3", 1, inputs=np.float32(1.1)))
    assert "input 0x3f8ccccd (1.100000023841858) [float32]: actual 0x40 (2.0)" in text
    with pytest.raises(ValueError, match="inputs have shape"):
        assert_bitwise_equal(np.zeros(2), np.ones(2), inputs=np.zeros(3))


# ------------------------------------------------------- docs/testing.md
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
DOC = ROOT / "docs" / "testing.md"


@pytest.fixture
def examples(monkeypatch):
    """The modules of docs/examples, freshly imported."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    for name in ("fake_quant", "test_fake_quant", "test_recipes"):
        sys.modules.pop(name, None)
    modules = {name: importlib.import_module(name) for name in ("fake_quant", "test_fake_quant", "test_recipes")}
    yield modules
    for name in modules:
        sys.modules.pop(name, None)


def test_docs_show_the_example_code_verbatim(examples):
    doc = DOC.read_text()
    test_source = inspect.getsource(examples["test_fake_quant"].test_fake_quant_e4m3)
    assert test_source in doc
    v1 = inspect.getsource(examples["fake_quant"].fake_quant_e4m3_v1)
    body = v1.split('"""')[-1]  # after the docstring
    assert body in doc
    assert inspect.getsource(examples["fake_quant"]._spacing) in doc
    assert "        q = np.rint(a / step) * step  # round to nearest, ties to even" in doc
    for name in ("test_ml_dtypes_e5m2_codes", "test_torch_float8_e4m3fn_cast", "test_dot_fp32_error_bound"):
        assert inspect.getsource(getattr(examples["test_recipes"], name)) in doc, name


def test_docs_failure_output_is_what_the_buggy_cast_gives(examples):
    """The assertion message pasted in the docs is reproduced exactly from its input."""
    doc = DOC.read_text().splitlines()
    first = next(i for i, line in enumerate(doc) if line.startswith("E       AssertionError: "))
    pasted = [doc[first].removeprefix("E       AssertionError: "), doc[first + 1].removeprefix("E       ")]
    bits = int(re.search(r"input (0x[0-9a-f]{8}) ", pasted[1]).group(1), 16)
    x = np.array([bits], dtype=np.uint32).view(np.float32)
    fq = examples["fake_quant"]
    want = fpsim.quantize(x, "e4m3", saturate=True)
    got = message(lambda: assert_bitwise_equal(fq.fake_quant_e4m3_v1(x), want, fmt="e4m3", inputs=x))
    assert got.splitlines() == pasted
    assert_bitwise_equal(fq.fake_quant_e4m3(x), want, fmt="e4m3")  # the fix
    assert doc[first + 3].strip() == f"E           x=array([{np.array2string(x)[1:-1]}], dtype=float32),"


def test_docs_hypothesis_test_fails_on_the_buggy_cast_and_passes_on_the_fix(examples, monkeypatch):
    fq, test = examples["fake_quant"], examples["test_fake_quant"].test_fake_quant_e4m3
    test = settings(database=None, derandomize=True, max_examples=100, deadline=None,
                    phases=[Phase.generate, Phase.shrink])(test)
    test()  # the fixed cast passes
    monkeypatch.setattr(fq, "fake_quant_e4m3", fq.fake_quant_e4m3_v1)
    with pytest.raises(AssertionError, match="Not bitwise equal in e4m3") as info:
        test()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "test_fake_quant_e4m3(" in notes and "x=array([" in notes


def test_docs_recipes_pass(examples):
    recipes = examples["test_recipes"]
    quick = settings(database=None, derandomize=True, max_examples=50, deadline=None)
    for name in ("test_ml_dtypes_e5m2_codes", "test_torch_float8_e4m3fn_cast", "test_dot_fp32_error_bound"):
        settings(quick)(getattr(recipes, name))()


@pytest.mark.parametrize("actual,desired", [
    (1.0, 1.0 + 2**-9), (np.float32(1), np.float32(1 + 2**-9)), (np.array(1.0), np.array(1 + 2**-9)),
    (torch.tensor(1.0), 1 + 2**-9), (1, np.array([1.0, 1 + 2**-9])),
])
def test_within_ulps_takes_scalars_and_0d_arrays(actual, desired):
    """docs/testing.md: numpy scalars and Python numbers are accepted. fp16's ulp at 1 is 2^-10 (10 fraction
    bits, IEEE 754), so 1 and 1 + 2^-9 are exactly 2 ulps apart: within 2, not within 1.5."""
    assert_within_ulps(actual, desired, "fp16", ulps=2)
    assert "error 2 ulps" in message(lambda: assert_within_ulps(actual, desired, "fp16", ulps=1.5))
