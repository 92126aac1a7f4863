"""fp16/bf16 ops computed in FP32 and rounded once (FP32Compute), against torch's real low-precision CPU kernels.

Source of truth: torch's own CPU kernels on bfloat16 and float16 tensors, run on the same
inputs. Where a CPU kernel computes in float32 and rounds once, as GPU kernels do, the
emulation must agree bit for bit; elsewhere the difference is bounded: one ulp of the
result for ops whose CPU kernel rounds an intermediate to the low format, and, for matrix
products, one ulp plus the float32 summation-order bound 2 K 2^-24 sum_k |a_k b_k| (the two
sides accumulate in float32 in different orders; Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed., eq. 3.5). fpsim.TensorCore, checked against GPU captures in
tests/tensorcore, is the reference for the tensor-core GEMM path.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fpsim
from fpsim.analyze.gpt import GPT, GPTConfig, token_batches
from fpsim.emulate.compute import GEMMS, FP32Compute, _low_dtype, _passes
from fpsim.emulate.gemm import TensorCoreGemm
from fpsim.testing import assert_bitwise_equal, assert_within_ulps

FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16"}
OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
    "exp": lambda a, b: torch.exp(a), "log": lambda a, b: torch.log(a.abs()), "tanh": lambda a, b: torch.tanh(a),
    "sigmoid": lambda a, b: torch.sigmoid(a), "silu": lambda a, b: F.silu(a), "relu": lambda a, b: F.relu(a),
    "gelu_tanh": lambda a, b: F.gelu(a, approximate="tanh"), "rsqrt": lambda a, b: torch.rsqrt(a.abs()),
    "pow": lambda a, b: a.pow(2), "sin": lambda a, b: torch.sin(a), "addcmul": lambda a, b: torch.addcmul(a, a, b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "softmax": lambda a, b: torch.softmax(a, -1),
    "sum": lambda a, b: a.sum(-1), "mean": lambda a, b: a.mean(-1), "var": lambda a, b: a.var(-1),
    "amax": lambda a, b: a.amax(-1), "cumsum": lambda a, b: a.cumsum(-1), "rms_norm": lambda a, b: F.rms_norm(a, (256,)),
    "mse_loss": lambda a, b: F.mse_loss(a, b), "norm": lambda a, b: a.norm(dim=-1),
    "sqrt": lambda a, b: torch.sqrt(a.abs()), "gelu": lambda a, b: F.gelu(a),
    "log_softmax": lambda a, b: torch.log_softmax(a, -1), "layer_norm": lambda a, b: F.layer_norm(a, (256,)),
    "erf": lambda a, b: torch.erf(a),
}
"""What torch 2.13's CPU kernels give next to one float32 computation, rounded once:"""
SAME_VALUES = {"gelu"}
"""equal values, but the low-precision GELU kernel gives -0 where float32's gives +0;"""
WITHIN_ULPS = {torch.bfloat16: {"log_softmax": 1, "layer_norm": 1, "erf": 2},
               torch.float16: {"log_softmax": 1, "layer_norm": 1, "erf": 2, "sqrt": 1}}
"""at most this many ulps of the result apart; every other op of OPS: the same bits. Measured with the
kernels torch picks for AVX2. With those it picks for AVX-512 (torch.backends.cpu.get_cpu_capability();
measured on an AMD EPYC with AVX-512 BF16) the float16 GELU (erf) kernel is up to 6 ulps from one rounding:"""
if torch.backends.cpu.get_cpu_capability() == "AVX512":
    WITHIN_ULPS[torch.float16]["gelu"] = 6
STEP_WITHIN_ULPS = {torch.float16: {"gelu": 1, "gelu_backward": 1}}
"""The aten ops of a GPT step (below) that are not bit-exact, GEMMs apart."""


def _inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(64, 256, generator=g) * 2).to(dtype) for _ in range(2)]


def _emulated(f, *args):
    with FP32Compute():
        return f(*args)


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
@pytest.mark.parametrize("name", OPS)
def test_each_op_agrees_with_the_cpu_kernel_as_stated(dtype, name):
    for seed in range(2):
        a, b = _inputs(dtype, seed)
        real, emulated = OPS[name](a, b), _emulated(OPS[name], a, b)
        assert emulated.dtype == real.dtype == dtype
        if name in WITHIN_ULPS[dtype]:
            assert_within_ulps(emulated, real, FORMAT[dtype], ulps=WITHIN_ULPS[dtype][name])
        elif name in SAME_VALUES:
            assert torch.equal(emulated, real)
        else:
            assert_bitwise_equal(emulated, real, FORMAT[dtype])


def _gemm_bound(real, a, b, k):
    """One ulp of the result plus float32's summation-order bound (module doc)."""
    from fpsim.testing import ulp

    spread = (a.float().abs() @ b.float().abs()).double()
    return ulp(real.float(), FORMAT[real.dtype]) + 2 * k * 2.0 ** -24 * spread


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_matrix_products_differ_only_by_the_order_of_fp32_summation(dtype):
    a, b = _inputs(dtype)
    real, emulated = a @ b.T, _emulated(lambda x, y: x @ y.T, a, b)
    difference = (real.double() - emulated.double()).abs()
    assert bool((difference <= _gemm_bound(real, a, b.T, a.shape[1])).all())
    assert (real == emulated).float().mean() > 0.99


class _Replay(TorchDispatchMode):
    """Recomputes every op of a real low-precision run with FP32Compute, from the same inputs."""

    def __init__(self):
        super().__init__()
        self.emulation = FP32Compute()
        self.results: dict = {}      # op name -> list of (real, emulated, args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        written = any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments)
        if _passes(func) or written or _low_dtype(args, kwargs) is None:
            return out
        cloned = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        emulated = self.emulation.__torch_dispatch__(func, types, tuple(cloned), dict(kwargs))
        pairs = zip(out, emulated) if isinstance(out, (tuple, list)) else [(out, emulated)]
        name = func._schema.name.split("::")[-1]
        for real, emu in pairs:
            if isinstance(real, torch.Tensor) and real.is_floating_point():
                self.results.setdefault(name, []).append((real, emu, args))
        return out


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_every_op_of_a_real_autocast_step_is_reproduced_from_its_inputs(dtype):
    cfg = GPTConfig(n_layer=2, n_embd=64, n_head=4, block_size=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    x, y = next(token_batches(cfg, 4, 1))
    replay = _Replay()
    with torch.autocast("cpu", dtype=dtype, cache_enabled=False), replay:
        model(x, y)[1].backward()
    exact = set()
    for name, results in replay.results.items():
        for real, emu, args in results:
            assert emu.dtype == real.dtype, name
            fmt = FORMAT.get(real.dtype, "fp32")
            if name in GEMMS:
                a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
                bound = _gemm_bound(real, a, b, a.shape[-1])
                assert bool(((real.double() - emu.double()).abs() <= bound).all()), name
            elif name in STEP_WITHIN_ULPS.get(dtype, {}):
                assert_within_ulps(emu, real, fmt, ulps=STEP_WITHIN_ULPS[dtype][name], err_msg=name)
            else:
                assert_bitwise_equal(emu, real, fmt, err_msg=name)
                exact.add(name)
    assert {"_softmax", "_softmax_backward_data", "mul", "add", "sum"} <= exact


def test_in_place_ops_round_into_the_real_tensor():
    a, b = _inputs(torch.bfloat16)
    real = a.clone().mul_(b).add_(1.5)
    target = a.clone()
    with FP32Compute():
        returned = target.mul_(b).add_(1.5)
    assert returned is target and target.dtype == torch.bfloat16
    assert_bitwise_equal(target, real, "bf16")


def test_an_op_without_a_meta_kernel_runs_as_torch_runs_it_and_is_named():
    library = torch.library.Library("fpsim_test_emulate", "DEF")
    try:
        library.define("twice(Tensor x) -> Tensor")
        library.impl("twice", lambda x: x * 2, "CPU")
        x = _inputs(torch.float16)[0]
        compute = FP32Compute()
        with compute:
            y = torch.ops.fpsim_test_emulate.twice(x)
        assert y.dtype == torch.float16 and torch.equal(y, x * 2)
        assert compute.unemulated == {"twice"}
    finally:
        library._destroy()


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_tensor_core_gemms_are_the_tensor_core_models_results(dtype):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(5, 40, generator=g).to(dtype), torch.randn(40, 6, generator=g).to(dtype)
    bias = torch.randn(6, generator=g).to(dtype)
    batch_a, batch_b = torch.randn(2, 5, 40, generator=g).to(dtype), torch.randn(2, 40, 6, generator=g).to(dtype)
    core = fpsim.TensorCore("h100", inputs=FORMAT[dtype], output="fp32")
    with FP32Compute(TensorCoreGemm("h100")):
        product, affine, batched = a @ b, torch.addmm(bias, a, b), torch.bmm(batch_a, batch_b)
    expected = core.matmul(a.float(), b.float())
    assert_bitwise_equal(product, expected.to(dtype), FORMAT[dtype])
    assert_bitwise_equal(affine, (expected + bias.float()).to(dtype), FORMAT[dtype])
    for i in range(2):
        assert_bitwise_equal(batched[i], core.matmul(batch_a[i].float(), batch_b[i].float()).to(dtype), FORMAT[dtype])


# Ops whose result the dtype itself defines. Source of truth: the same call by real torch outside the
# emulation, and the IEEE binary16 / bfloat16 grids (largest finite values 65504 and (2 - 2^-7) 2^127;
# spacing 2^-10 above 1 and 2^-11 below it in fp16, 2^-7 and 2^-8 in bf16).
_LARGEST = {torch.float16: 65504.0, torch.bfloat16: (2 - 2 ** -7) * 2.0 ** 127}
_AROUND_ONE = {torch.float16: (1 - 2 ** -11, 1 + 2 ** -10), torch.bfloat16: (1 - 2 ** -8, 1 + 2 ** -7)}


def _in_block(dtype, f):
    with fpsim.emulate(torch.nn.Linear(2, 2), FORMAT[dtype]):
        return f()


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_nan_to_num_replaces_infinities_by_the_dtypes_largest_values(dtype):
    x = torch.tensor([float("inf"), float("-inf"), float("nan"), 1.5], dtype=dtype)
    big = _LARGEST[dtype]
    for call in (lambda: torch.nan_to_num(x), lambda: x.clone().nan_to_num_(),
                 lambda: torch.nan_to_num(x, out=torch.empty_like(x))):
        got = _in_block(dtype, call)
        assert got.dtype == dtype and got.tolist() == [big, -big, 0.0, 1.5]
        assert_bitwise_equal(got, call(), FORMAT[dtype])


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
def test_nextafter_steps_to_the_next_value_of_the_dtype(dtype):
    one, two, zero = (torch.tensor([v, v], dtype=dtype) for v in (1.0, 2.0, 0.0))
    below, above = _AROUND_ONE[dtype]
    got = _in_block(dtype, lambda: (torch.nextafter(one, two), torch.nextafter(one, zero), one.clone().nextafter_(two)))
    assert [t.tolist() for t in got] == [[above, above], [below, below], [above, above]]
    inf = torch.tensor([float("inf")], dtype=dtype)
    assert _in_block(dtype, lambda: torch.nextafter(inf, one[:1])).item() == _LARGEST[dtype]


SAMPLERS = {
    "uniform_": lambda x: x.uniform_(0, 1), "uniform_ wide": lambda x: x.uniform_(-3, 1e4),
    "random_": lambda x: x.random_(),
    "normal mean tensor": lambda x: torch.normal(x.fill_(0.3), 2.0),
}


@pytest.mark.parametrize("dtype", FORMAT, ids=FORMAT.values())
@pytest.mark.parametrize("name", SAMPLERS)
def test_random_sampling_draws_in_the_dtype_as_torch_does(dtype, name):
    """Same seed, same values as real torch: uniform_ never reaches its upper bound, random_() stays
    within the integers the dtype holds exactly (at most 2^11 in fp16, 2^8 in bf16)."""
    def draw():
        torch.manual_seed(0)
        return SAMPLERS[name](torch.empty(4096, dtype=dtype))
    got = _in_block(dtype, draw)
    assert got.dtype == dtype
    assert_bitwise_equal(got, draw(), FORMAT[dtype])
    if name == "uniform_":
        assert got.max().item() < 1
    if name == "random_":
        assert got.max().item() <= {torch.float16: 2 ** 11, torch.bfloat16: 2 ** 8}[dtype]
