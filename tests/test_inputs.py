"""Every input a user has reaches quantize/encode/decode correctly, or is refused clearly.

Sources of truth: the Fraction oracle fpsim.exact (round_value, decode_code) for every
expected value; ml_dtypes and torch for what their dtypes hold; torch's own autograd for
what a gradient is; PyTorch's header c10/util/Float4_e2m1fn_x2.h for the packing of
torch.float4_e2m1fn_x2 (the first value in the low nibble); the straight-through estimator's
definition (Bengio et al. 2013) for the gradients of quantize.
"""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

import fpsim
from fpsim import decode, encode, exact, quantize
from fpsim.formats import PRESETS

from foundation_helpers import assert_same_bits, assert_same_codes, oracle, requires_torch, torch

X = np.array([0.1, -3.3, 500.0, 1e-4, -0.0, 2.0**-9 * 3], dtype=np.float64)


def _codes_oracle(values, fmt):
    return np.array([exact.encode_value(exact.round_value(float(v), fmt), fmt) for v in np.ravel(values)])


# ------------------------------------------------------- tensors that require grad
@requires_torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("name", ["e4m3", "bf16", "fp16", "e2m1"])
def test_tensors_that_require_grad_round_and_pass_the_gradient_straight_through(dtype, name):
    x = torch.tensor(X[:4], dtype=getattr(torch, dtype), requires_grad=True)
    y = quantize(x, name, saturate=True)
    assert y.requires_grad and y.device == x.device
    expected = oracle(x.detach().double().numpy(), PRESETS[name], saturate=True)
    assert_same_bits(y.detach(), expected)
    upstream = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=y.dtype)
    y.backward(upstream)
    assert x.grad.dtype == x.dtype  # the gradient comes back in the input's dtype
    assert torch.equal(x.grad, upstream.to(x.dtype))  # identity: d quantize / dx := 1


@requires_torch
def test_clipped_gradient_is_zero_outside_the_format_range():
    x = torch.tensor([0.5, -300.0, 500.0, -1e4, float("inf"), float("nan")], requires_grad=True)
    y = quantize(x, "e4m3", saturate=True, grad="clipped")
    y.backward(torch.ones(6))
    assert x.grad.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # |x| <= 448 passes


@requires_torch
def test_gradient_can_be_detached_and_no_grad_mode_builds_no_graph():
    x = torch.tensor([0.3, 7.0], requires_grad=True)
    assert not quantize(x, "e4m3", grad="none").requires_grad
    with torch.no_grad():
        assert quantize(x, "e4m3").grad_fn is None
    with pytest.raises(ValueError, match="grad must be one of identity, clipped, none"):
        quantize(x, "e4m3", grad="straight")


@requires_torch
def test_fake_quantised_linear_layer_trains():
    """quantize inside a model's forward: backward reaches the weights as the straight-through
    estimator says, dL/dW = (2 q(o))^T q(x) for L = sum q(o)^2, o = W q(x) + b, with q from ml_dtypes."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    (quantize(layer(quantize(x, "e4m3")), "e4m3") ** 2).sum().backward()

    def q(t):
        return torch.from_numpy(t.detach().numpy().astype(ml_dtypes.float8_e4m3fn).astype(np.float32))

    qx = q(x)
    qo = q(qx @ layer.weight.detach().T + layer.bias.detach())
    assert torch.allclose(layer.weight.grad, (2 * qo).T @ qx, rtol=1e-6, atol=1e-6)
    assert torch.allclose(layer.bias.grad, (2 * qo).sum(0), rtol=1e-6, atol=1e-6)


@requires_torch
def test_encode_reads_a_tensor_that_requires_grad():
    x = torch.tensor(X[:4], dtype=torch.float32, requires_grad=True)
    assert_same_codes(encode(x, "e4m3").numpy(), _codes_oracle(X[:4].astype(np.float32), PRESETS["e4m3"]))


# ------------------------------------------------------ one validation everywhere
def _input_kinds():
    kinds = {"float16": X.astype(np.float16), "float32": X.astype(np.float32), "float64": X,
             "int64": np.array([1, -3, 500]), "bfloat16": X.astype(ml_dtypes.bfloat16)}
    if torch is not None:
        kinds["torch"] = torch.tensor(X, dtype=torch.float32)
    return kinds


BAD_OPTIONS = {
    "saturate='no'": (dict(saturate="no"), TypeError, "saturate must be True or False, got str 'no'"),
    "flush_in='no'": (dict(flush_subnormal_inputs="no"), TypeError, "flush_subnormal_inputs must be True or False"),
    "flush_out=1": (dict(flush_subnormal_outputs=1), TypeError, "flush_subnormal_outputs must be True or False"),
    "rand_bits=True": (dict(rounding="stochastic", rand_bits=True), TypeError, "rand_bits must be an int"),
    "rand_bits=3.0": (dict(rounding="stochastic", rand_bits=3.0), TypeError, "rand_bits must be an int"),
    "rand_bits=0": (dict(rounding="stochastic", rand_bits=0), ValueError, "rand_bits must be an int in 1..52"),
    "rand_bits nearest": (dict(rand_bits=4), ValueError, "rand_bits applies to rounding='stochastic' only"),
    "seed and generator": (dict(rounding="stochastic", seed=1, generator=np.random.default_rng(1)), ValueError,
                           "either seed or generator"),
    "seed=-1": (dict(rounding="stochastic", seed=-1), ValueError, "seed must be an int in 0..2\\*\\*64-1"),
    "seed=1.5": (dict(rounding="stochastic", seed=1.5), TypeError, "seed must be an int"),
    "generator=42": (dict(rounding="stochastic", generator=42), TypeError, "generator must be a numpy.random"),
    "rounding=3": (dict(rounding=3), TypeError, "rounding must be a mode name"),
    "rounding='nearest'": (dict(rounding="nearest"), ValueError, "unknown rounding mode 'nearest'"),
}


@pytest.mark.parametrize("kind", list(_input_kinds()))
@pytest.mark.parametrize("case", list(BAD_OPTIONS))
@pytest.mark.parametrize("function", [quantize, encode], ids=["quantize", "encode"])
def test_every_bad_option_is_refused_on_every_input_kind(function, case, kind):
    options, error, message = BAD_OPTIONS[case]
    x = _input_kinds()[kind]
    before = x.clone() if torch is not None and isinstance(x, torch.Tensor) else x.copy()
    with pytest.raises(error, match=message):
        function(x, "e4m3", **options)
    same = torch.equal(x, before) if torch is not None and isinstance(x, torch.Tensor) else \
        np.array_equal(x.view(np.uint8), before.view(np.uint8))
    assert same  # the input is untouched


def test_encode_takes_exactly_quantizes_options():
    with pytest.raises(TypeError, match="unexpected keyword argument.*'flush'"):
        encode(X.astype(np.float32), "e4m3", flush=True)
    with pytest.raises(TypeError, match="unexpected keyword argument.*'grad'"):
        encode(X.astype(np.float32), "e4m3", grad="none")  # codes have no gradient


# ------------------------------------------------ inputs that are valid: right answers
def test_python_lists_with_huge_integers_round_from_their_exact_value():
    assert_same_bits(quantize([1, 2**70], "e4m3"), oracle([1, 2**70], PRESETS["e4m3"]))
    huge = 2**60 + 2**36 + 1  # above the fp32 tie 2^60 + 2^36: float64 would first make it the tie
    got = quantize([0.5, huge], "fp32")
    assert got[1] == exact.round_value(huge, "fp32") == 2.0**60 + 2.0**37
    assert got[0] == 0.5
    with pytest.raises(TypeError, match="cannot round str"):
        quantize(np.array([1, "a"], dtype=object), "e4m3")


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">f2", ">i8", ">u4", "<f4"])
def test_any_byte_order(dtype):
    x = np.array([1.1, 300.0, 7.0, 0.0], dtype=np.float64).astype(dtype)
    before = x.copy()
    got = quantize(x, "e4m3")
    assert_same_bits(got, oracle(x.astype(np.float64), PRESETS["e4m3"]))
    assert got.dtype.isnative
    assert_same_codes(encode(x, "e4m3"), _codes_oracle(x.astype(np.float64), PRESETS["e4m3"]))
    assert np.array_equal(x.view(np.uint8), before.view(np.uint8))


ML_FLOAT_TYPES = ["float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e5m3fnu", "float8_e4m3fn",
                  "float8_e8m0fnu", "float6_e3m2fn", "float6_e2m3fn", "float4_e2m1fn", "bfloat16"]


@pytest.mark.parametrize("type_name", ML_FLOAT_TYPES)
def test_arrays_of_every_ml_dtypes_float_type(type_name):
    dtype = getattr(ml_dtypes, type_name)
    codes = np.arange(256 if np.dtype(dtype).itemsize == 1 else 65536, dtype=np.uint64)
    limit = 1 << {"float6_e3m2fn": 6, "float6_e2m3fn": 6, "float4_e2m1fn": 4}.get(type_name, 8 * np.dtype(dtype).itemsize)
    values = codes[:limit].astype(np.uint8 if np.dtype(dtype).itemsize == 1 else np.uint16).view(dtype)
    exact_values = values.astype(np.float64)  # what ml_dtypes says the codes mean
    own = fpsim.format(dtype)
    assert_same_bits(decode(codes[:limit], own), exact_values)  # the preset is the dtype's own format
    finite = values[np.isfinite(exact_values)]
    got = quantize(finite, "e4m3", "toward_zero")
    assert_same_bits(got, oracle(finite.astype(np.float64), PRESETS["e4m3"], "toward_zero"))


def test_ml_dtypes_integer_arrays():
    x = np.array([-8, -1, 0, 5, 7], dtype=ml_dtypes.int4)
    assert_same_bits(quantize(x, "e2m1"), oracle([-8, -1, 0, 5, 7], PRESETS["e2m1"]))
    u = np.array([0, 3, 15], dtype=ml_dtypes.uint4)
    assert_same_bits(quantize(u, "e2m1"), oracle([0, 3, 15], PRESETS["e2m1"]))


@requires_torch
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                   "float8_e8m0fnu", "bfloat16", "float16"])
def test_torch_float8_tensors(dtype):
    t = torch.tensor([0.3, 2.5, 96.0, 1.0]).to(getattr(torch, dtype))
    values = t.double().numpy()  # what torch says the tensor holds
    got = quantize(t, "e2m1", "up")
    assert isinstance(got, torch.Tensor)
    assert_same_bits(got.double().numpy(), oracle(values, PRESETS["e2m1"], "up"))


@requires_torch
def test_torch_float4_pairs_decode_low_nibble_first():
    low, high = 0b0011, 0b1110  # e2m1 codes: 1.5 and -4.0
    packed = torch.tensor([[high << 4 | low, low << 4 | high]], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    got = decode(packed, "e2m1")
    value = {c: exact.decode_code(c, "e2m1") for c in (low, high)}
    assert got.shape == (1, 4)
    assert got.tolist() == [[value[low], value[high], value[high], value[low]]]
    with pytest.raises(TypeError, match="fpsim.decode"):
        quantize(packed, "e4m3")


def test_masked_arrays_keep_their_mask():
    x = np.ma.masked_array([1.1, np.nan, 300.0, -2.2], mask=[False, True, False, False])
    got = quantize(x, "e2m1")  # the masked NaN is no input: e2m1 has no NaN but nothing is refused
    assert isinstance(got, np.ma.MaskedArray)
    assert got.mask.tolist() == [False, True, False, False]
    kept = ~got.mask
    assert_same_bits(got.data[kept], oracle(x.data[kept], PRESETS["e2m1"]))
    codes = encode(x, "e4m3")
    assert isinstance(codes, np.ma.MaskedArray) and codes.mask.tolist() == x.mask.tolist()
    assert_same_codes(codes.data[kept], _codes_oracle(x.data[kept], PRESETS["e4m3"]))


def test_matrices_stay_matrices():
    m = np.matrix([[1.1, 2.2], [300.0, -0.01]])
    got = quantize(m, "e4m3")
    assert isinstance(got, np.matrix) and got.shape == (2, 2)
    assert_same_bits(np.asarray(got), oracle(np.asarray(m), PRESETS["e4m3"]))


def test_jax_arrays_come_back_as_jax_arrays():
    jnp = pytest.importorskip("jax.numpy")  # in the test extra; optional for users
    x = jnp.asarray(X.astype(np.float32))
    got = quantize(x, "e4m3")
    assert type(got) is type(x)
    assert_same_bits(np.asarray(got), oracle(X.astype(np.float32), PRESETS["e4m3"]))
    codes = encode(x, "bf16")
    assert type(codes) is type(x)
    assert_same_codes(np.asarray(codes), _codes_oracle(X.astype(np.float32), PRESETS["bf16"]))
    assert_same_bits(np.asarray(decode(codes, "bf16")), oracle(X.astype(np.float32), PRESETS["bf16"]))


@requires_torch
def test_meta_tensors_give_meta_results_of_the_right_shape_and_dtype():
    t = torch.empty(3, 5, dtype=torch.float32, device="meta")
    q = quantize(t, "bf16")
    assert q.device.type == "meta" and q.shape == (3, 5) and q.dtype == torch.float32
    c = encode(t, "e4m3")
    assert c.device.type == "meta" and c.dtype == torch.uint8
    d = decode(torch.empty(4, dtype=torch.uint8, device="meta"), "e4m3")
    assert d.device.type == "meta" and d.dtype == torch.float32


# ----------------------------------------------------------------- refusals
@pytest.mark.parametrize("name,value,message", [
    ("e2m1", np.nan, "e2m1 has no NaN; the input holds NaN at index \\(\\)"),
    ("e3m2", [1.0, np.nan], "e3m2 has no NaN; the input holds NaN at index \\(1,\\)"),
])
def test_inputs_without_a_code_are_refused(name, value, message):
    for function in (quantize, encode):
        with pytest.raises(ValueError, match=message):
            function(value, name)
        with pytest.raises(ValueError, match=message):
            function(np.asarray(value, dtype=np.float32), name)
        if torch is not None:
            with pytest.raises(ValueError, match=message):
                function(torch.tensor(value, dtype=torch.float32), name)


def test_codes_beyond_the_format_name_their_true_value():
    for codes in (np.uint64(2**64 - 1), 2**64 - 1, np.array([1, 2**40], dtype=np.uint64), [3, 2**70]):
        with pytest.raises(ValueError, match=r"code \d+ at index .* is outside 0..255 for e4m3"):
            decode(codes, "e4m3")
    with pytest.raises(ValueError, match="code 18446744073709551615 at index"):
        decode(np.uint64(2**64 - 1), "e4m3")


# ----------------------------------------------------------- light import, no kernel
def test_import_fpsim_and_numpy_rounding_do_not_load_torch():
    code = ("import sys, numpy as np, fpsim; fpsim.quantize(np.ones(3), 'e4m3'); fpsim.encode([1.0], 'bf16');"
            "fpsim.format('e5m2'); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_without_the_kernel_the_numpy_engine_warns_once_and_gives_the_same_bits():
    """fpsim installed without a C compiler: its extension module is missing, which we reproduce by
    refusing its import."""
    code = """
import sys, warnings, importlib.abc
class NoKernel(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "fpsim._fastround":
            raise ImportError("no compiler")
sys.meta_path.insert(0, NoKernel())
import numpy as np, fpsim
from fpsim import _native
assert not _native.available()
x = (np.random.default_rng(3).standard_normal(20000) * 50).astype(np.float32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    q = fpsim.quantize(x, "e4m3"); fpsim.quantize(x, "bf16"); c = fpsim.encode(x, "e5m2")
print(sum("compiled rounding kernel is not built" in str(w.message) for w in caught))
np.save(sys.argv[1], np.concatenate([q.view(np.uint32).astype(np.int64), c.astype(np.int64)]))
"""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bits.npy"
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "1"  # one warning for three calls
        x = (np.random.default_rng(3).standard_normal(20000) * 50).astype(np.float32)
        expected = np.concatenate([quantize(x, "e4m3").view(np.uint32).astype(np.int64),
                                   encode(x, "e5m2").astype(np.int64)])
        assert np.array_equal(np.load(path), expected)
    assert "docs/speed.md" in fpsim._native.NO_KERNEL_WARNING


def test_fraction_inputs_stay_refused_with_the_allowed_list():
    with pytest.raises(TypeError, match="allowed"):
        quantize(Fraction(1, 3), "e4m3")


# ------------------------------------------- conversions at the edges of torch's and ml_dtypes' casts
@requires_torch
@pytest.mark.parametrize("dtype, nan_bits", [("bfloat16", (0x7FC0, -0x0040)), ("float16", (0x7E00, -0x0200))])
@pytest.mark.parametrize("length", [1, 7, 9])
def test_torch_16_bit_nans_and_overflows_keep_their_sign(dtype, nan_bits, length):
    # torch's casts from float32 to bfloat16 give every NaN one pattern, and float16's lose a NaN's sign
    # outside their vector loop (tensors under 8 elements, tails): a NaN result keeps the input's sign, as
    # on numpy input (README), and an overflow to E4M3's NaN has the sign of the value (oracle: 0x7f/0xff)
    tdtype = getattr(torch, dtype)
    nans = torch.tensor(list(nan_bits) * length, dtype=torch.int16)[:length].view(tdtype)
    negative = (torch.arange(length) % 2).bool()
    for fmt in ("bf16", "fp16", "e4m3"):
        got = quantize(nans, fmt)
        assert torch.isnan(got).all() and torch.equal(torch.signbit(got), negative), (fmt, got)
    big = torch.where(negative, torch.tensor(-1000.0), torch.tensor(1000.0)).to(tdtype)
    want = [exact.encode_value(exact.round_value(float(v), "e4m3"), "e4m3") | (0x80 if v < 0 else 0) for v in big]
    assert encode(big, "e4m3").tolist() == want
    assert torch.equal(torch.signbit(quantize(big, "e4m3")), negative)


@requires_torch
def test_e4m3fn_input_into_e4m3_ieee_overflows_to_inf():
    # E4M3FN holds every finite value of E4M3 (IEEE-like) but not its Inf: the result comes back in float32
    values = np.array([256.0, -256.0, 240.0])
    want = [exact.round_value(v, "e4m3ieee") for v in values]
    assert want[:2] == [float("inf"), float("-inf")]
    for x in (values.astype(ml_dtypes.float8_e4m3fn), torch.tensor(values).to(torch.float8_e4m3fn)):
        got = quantize(x, "e4m3ieee")
        assert [float(v) for v in got] == want
        assert [int(c) for c in encode(x, "e4m3ieee")] == [exact.encode_value(v, "e4m3ieee") for v in want]


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu])
def test_ml_dtypes_nan_is_refused_where_the_format_has_none(dtype):
    # most ml_dtypes types are numpy kind "V": their NaN was let through by quantize (encode refused it)
    x = np.array([1.0, np.nan], dtype=dtype)
    for call in (quantize, encode):
        with pytest.raises(ValueError, match="e2m1 has no NaN; the input holds NaN at index"):
            call(x, "e2m1")


@requires_torch
def test_zero_dimensional_tensors_keep_their_shape():
    t = torch.tensor(0.3)
    assert quantize(t, "e4m3").shape == encode(t, "e4m3").shape == decode(encode(t, "e4m3"), "e4m3").shape == ()
    assert float(quantize(t, "e4m3")) == exact.round_value(float(t), "e4m3")


@requires_torch
@pytest.mark.parametrize("dtype, fmt, value", [("bfloat16", "fp16", 65536.0), ("float32", "fp64", float("inf")),
                                               ("float16", "bf16", float("inf")), ("bfloat16", "tf32", float("inf"))])
def test_clipped_gradient_compares_with_the_format_max_exactly(dtype, fmt, value):
    # the mask compared in the input's dtype, where the format's max rounds (65504 to 65536 in bfloat16)
    # or is Inf: values beyond the max got gradient 1
    x = torch.tensor([value, 1.0], dtype=getattr(torch, dtype), requires_grad=True)
    quantize(x, fmt, saturate=True, grad="clipped").sum().backward()
    assert x.grad.tolist() == [0.0, 1.0]


# ------------------------------------------------------- memory layout
@pytest.mark.parametrize("name", ["e4m3", "bf16", "fp16"])
def test_a_fortran_ordered_array_comes_back_in_its_order_as_numpys_astype_gives(name):
    # the engine works in row-major order: results and codes came back C-ordered whatever the input's order
    x = np.asfortranarray(np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32) * 8)
    dtype = {"e4m3": ml_dtypes.float8_e4m3fn, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}[name]
    values, codes = quantize(x, name), encode(x, name)
    expected = x.astype(dtype)
    assert np.array_equal(values, expected.astype(np.float32)) and values.strides == expected.astype(np.float32).strides
    assert codes.strides == expected.view(f"u{expected.itemsize}").strides
    assert np.array_equal(codes, expected.view(f"u{expected.itemsize}"))


@requires_torch
@pytest.mark.parametrize("name, dtype", [("e4m3", "float8_e4m3fn"), ("bf16", "bfloat16"), ("fp16", "float16")])
def test_a_channels_last_or_transposed_tensor_keeps_its_layout_as_torchs_own_cast_does(name, dtype):
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
              torch.randn(5, 7, generator=g).t()):
        expected = x.to(getattr(torch, dtype)).to(torch.float32)    # torch's own round trip, preserve_format
        values = quantize(x.requires_grad_(), name)
        assert torch.equal(values, expected) and values.stride() == expected.stride()
        values.sum().backward()                                    # the gradient still goes straight through
        assert torch.equal(x.grad, torch.ones_like(x))
        codes = encode(x.detach(), name)
        assert codes.stride() == expected.stride() and torch.equal(decode(codes, name), expected)


@pytest.fixture
def one_rank_mesh(tmp_path):
    """A torch.distributed process group of one rank (gloo) and its CPU device mesh."""
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_dtensors_round_as_their_full_tensors_and_stay_dtensors(one_rank_mesh):
    """A sharded DTensor (FSDP2's parameters, tensor parallelism's outputs) rounds element by element, as
    torch's own E4M3 cast rounds its full tensor; its codes too; a gradient goes through to it."""
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)) * 10
    x = distribute_tensor(full, one_rank_mesh, [Shard(0)]).requires_grad_(True)
    y = fpsim.quantize(x, "e4m3")
    assert type(y) is type(x) and tuple(y.placements) == (Shard(0),)
    assert torch.equal(y.full_tensor(), full.to(torch.float8_e4m3fn).float())
    codes = fpsim.encode(x.detach(), "e4m3")
    assert torch.equal(codes.full_tensor(), full.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(fpsim.decode(codes, "e4m3").full_tensor(), full.to(torch.float8_e4m3fn).float())
    y.full_tensor().sum().backward()
    assert torch.equal(x.grad.full_tensor(), torch.ones(8, 4))


def test_dtensors_that_rounding_does_not_commute_with_are_refused(one_rank_mesh):
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    pending = DTensor.from_local(torch.ones(4), one_rank_mesh, [Partial()])
    with pytest.raises(ValueError, match="pending sum"):
        fpsim.quantize(pending, "e4m3")
    sharded = distribute_tensor(torch.ones(4), one_rank_mesh, [Shard(0)])
    with pytest.raises(ValueError, match="stochastic rounding of a DTensor"):
        fpsim.quantize(sharded, "e4m3", "stochastic", seed=0)


# ------------------------------------------------------- block formats: every input kind
def _mx_oracle(row):
    """One MXFP8 E4M3 block's dequantised values from the OCP MX v1.0 oracle (fpsim.exact_blocks)."""
    from fpsim import exact_blocks

    return exact_blocks.quantize_block(row, "e4m3", "e8m0", "floor")[2]


def test_block_formats_keep_a_masked_arrays_mask_a_matrix_and_a_fortran_order():
    """As element formats do: the mask stays (its slots round as zeros, which leave the block's amax alone),
    a matrix comes back a matrix, a Fortran-ordered array in its order; the values are the spec's."""
    data = np.random.default_rng(0).normal(size=(2, 32)) * 5
    masked = np.ma.masked_array(data, mask=np.arange(64).reshape(2, 32) % 7 == 0)
    values = fpsim.quantize(masked, "mxfp8_e4m3")
    assert isinstance(values, np.ma.MaskedArray) and np.array_equal(values.mask, masked.mask)
    plain = np.where(masked.mask, 0.0, data)
    assert np.array_equal(values.data, [_mx_oracle(row) for row in plain])
    codes = fpsim.encode(masked, "mxfp8_e4m3")
    assert np.array_equal(codes.codes.mask, masked.mask)
    back = fpsim.decode(codes)
    assert np.array_equal(back.mask, masked.mask) and np.array_equal(back.data, values.data)
    assert type(fpsim.quantize(np.asmatrix(data), "mxfp8_e4m3")) is np.matrix
    fortran = np.asfortranarray(data.astype(np.float32))
    result = fpsim.quantize(fortran, "mxfp8_e4m3")
    assert result.flags.f_contiguous and np.array_equal(result, [_mx_oracle(row) for row in fortran])


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4"])
def test_integers_float64_does_not_hold_are_refused_by_block_formats_from_numpy_or_torch(fmt):
    # a torch int64 tensor was converted to float64 first (2^54 * 17 + 1 silently became 2^54 * 17), and
    # numpy's 2^53 + 1 passed the check after the same conversion
    for big in (17 * 2**54 + 1, 2**53 + 1, -(2**53) - 1):
        with pytest.raises(ValueError, match=f"integer {big} is not exactly a float64"):
            fpsim.quantize(np.array([big, 1] * 16, dtype=np.int64), fmt)
        if torch is not None:
            with pytest.raises(ValueError, match=f"integer {big} is not exactly a float64"):
                fpsim.quantize(torch.tensor([big, 1] * 16, dtype=torch.int64), fmt)
    exact_ints = np.array([2**53, -(2**53), 2**60, -(2**62)] * 8, dtype=np.int64)   # float64 holds these
    assert np.array_equal(fpsim.quantize(exact_ints, fmt), fpsim.quantize(exact_ints.astype(np.float64), fmt))


def test_decode_of_mxint8_refuses_codes_outside_its_8_bits_as_float_elements_do():
    enc = fpsim.encode(np.linspace(-1, 1, 32), "mxint8")
    for bad in (300, -5, 1000):
        codes = enc.codes.astype(np.int64)
        codes[0] = bad
        with pytest.raises(ValueError, match=f"code {bad} at index \\(0,\\) is outside 0..255"):
            fpsim.decode(BlockEncodingOf(enc, codes))
    with pytest.raises(TypeError, match="must be integers"):
        fpsim.decode(BlockEncodingOf(enc, enc.codes.astype(np.float64) + 0.7))
    assert np.array_equal(fpsim.decode(enc), fpsim.quantize(np.linspace(-1, 1, 32), "mxint8"))


def BlockEncodingOf(enc, codes):
    import dataclasses

    return dataclasses.replace(enc, codes=codes)


def test_decode_names_what_is_wrong_with_an_encoding():
    enc = fpsim.encode(np.ones(32, dtype=np.float32), "nvfp4")
    with pytest.raises(TypeError, match="carries its format \\(nvfp4\\)"):
        fpsim.decode(enc, "nvfp4")
    with pytest.raises(ValueError, match="nvfp4 has a tensor scale: this encoding's tensor_scale is None"):
        fpsim.decode(BlockEncodingOfScale(enc, None))
    mx = fpsim.encode(np.ones(32, dtype=np.float32), "mxfp4")
    with pytest.raises(ValueError, match="mxfp4 has no tensor scale"):
        fpsim.decode(BlockEncodingOfScale(mx, 1.0))


def BlockEncodingOfScale(enc, tensor_scale):
    import dataclasses

    return dataclasses.replace(enc, tensor_scale=tensor_scale)


@pytest.mark.parametrize("value", [np.float32(1e-4), np.float16(0.5), np.int64(1), 2])
def test_a_block_formats_amax_floor_takes_any_real_number_it_names(value):
    fmt = fpsim.BlockFormat("e4m3", "fp32", 128, "nearest", amax_floor=value)
    assert fmt.amax_floor == float(value)
    with pytest.raises(ValueError, match="amax_floor must be a finite number >= 0, got True"):
        fpsim.BlockFormat("e4m3", "fp32", 128, "nearest", amax_floor=True)


@requires_torch
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "nvfp4", "mxint8"])
def test_meta_tensors_give_block_results_of_the_real_shapes_and_dtypes(fmt):
    """A meta tensor (torch.compile's tracing) has no data: its results have the shapes and dtypes that the
    same call on real data gives (it raised 'Cannot copy out of meta tensor')."""
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        real_in = torch.randn(3, 40).to(dtype)
        meta_in = torch.empty(3, 40, dtype=dtype, device="meta")
        real, meta = fpsim.quantize(real_in, fmt), fpsim.quantize(meta_in, fmt)
        assert meta.device.type == "meta" and (meta.shape, meta.dtype) == (real.shape, real.dtype)
        real_enc, meta_enc = fpsim.encode(real_in, fmt), fpsim.encode(meta_in, fmt)
        for a, b in ((real_enc.codes, meta_enc.codes), (real_enc.scales, meta_enc.scales)):
            assert b.device.type == "meta" and (a.shape, a.dtype) == (b.shape, b.dtype)
        assert (real_enc.tensor_scale is None) == (meta_enc.tensor_scale is None)
        decoded = fpsim.decode(meta_enc)
        assert decoded.device.type == "meta" and decoded.dtype == fpsim.decode(real_enc).dtype


def test_dtensors_in_block_formats_round_as_their_full_tensor_where_blocks_are_whole(one_rank_mesh):
    """Sharded along an axis without blocks, each rank's blocks are the full tensor's: the same values and a
    DTensor back (before, a plain tensor of the local part came back). Sharded along the blocked axis, a rank's
    blocks would not be the full tensor's: refused, as is encode (its codes and scales are no one DTensor)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    full = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 10
    rows = distribute_tensor(full, one_rank_mesh, [Shard(0)])
    y = fpsim.quantize(rows, "mxfp8_e4m3")
    assert type(y) is type(rows) and tuple(y.placements) == (Shard(0),)
    assert torch.equal(y.full_tensor(), torch.tensor([_mx_oracle(row[:32]) + _mx_oracle(row[32:])
                                                      for row in full.tolist()]))
    with pytest.raises(ValueError, match="sharded along 1"):
        fpsim.quantize(distribute_tensor(full, one_rank_mesh, [Shard(1)]), "mxfp8_e4m3")
    with pytest.raises(ValueError, match="encode of a DTensor"):
        fpsim.encode(rows, "mxfp8_e4m3")
