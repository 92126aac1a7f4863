"""torch.autocast's op policy as fpsim.emulate applies it, held to torch itself.

Sources of truth: the dispatcher's own Autocast registrations (which ops have a policy), real
torch.autocast on CPU tensors (the CPU policy: output dtypes and values), and torch's CUDA
autocast kernels run on fake CUDA tensors (the CUDA policy's output dtypes, with no GPU: fake
tensors carry CUDA dispatch keys, so torch's own AutocastCUDA kernels act on them). The
emulation applies each policy to CPU tensors through `PolicyKernels`; every op of both tables
is called in four dtype mixes and two low formats, except the few named in NOT_CALLABLE.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from fpsim.emulate.autocast import PolicyKernels, registered_ops, resolve_op
from fpsim.emulate.policy import BANNED_MESSAGE, policy

from autocast_cases import arguments, maker, on_fake_cuda

LOWS = (torch.bfloat16, torch.float16)
MIXES = ("low", "fp32", "low,fp32", "fp32,low")
NOT_CALLABLE = {
    "cpu": {"mkldnn_rnn_layer": "takes oneDNN's packed RNN weights"},
    "cuda": {
        "cudnn_convolution": "a cuDNN kernel: no CPU implementation to emulate on",
        "cudnn_convolution_transpose": "a cuDNN kernel: no CPU implementation to emulate on",
        "_scaled_dot_product_flash_attention": "a CUDA-only kernel: no CPU implementation to emulate on",
        "_thnn_fused_lstm_cell": "a CUDA-only kernel: no CPU implementation to emulate on",
        "_thnn_fused_gru_cell": "a CUDA-only kernel: no CPU implementation to emulate on",
        "lstm_cell": "decomposes into CUDA-only kernels on fake CUDA tensors (no reference without a GPU)",
        "gru_cell": "decomposes into CUDA-only kernels on fake CUDA tensors (no reference without a GPU)",
        "grid_sampler": "has no fake CUDA kernel in a CPU build of torch (no reference without a GPU)",
    },
}


def _dtypes(mix: str, low):
    return [low if part == "low" else torch.float32 for part in mix.split(",")]


def _leaves(value):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _outcome(call):
    """What a call gives: its outputs' dtypes, or the error it raises."""
    try:
        out = call()
    except Exception as err:   # noqa: BLE001 - the error is the outcome to compare
        return ("raises", type(err).__name__, str(err).splitlines()[0] if str(err) else "")
    return tuple(t.dtype if isinstance(t, torch.Tensor) else type(t).__name__ for t in _leaves(out))


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _cases(device_type: str, low):
    """(op name, mix, arguments) for every callable op of a table and every dtype mix."""
    for name in sorted(policy(device_type)):
        if name in NOT_CALLABLE[device_type]:
            continue
        for mix in MIXES:
            args = arguments(name, maker(_dtypes(mix, low)))
            assert args is not None, f"no arguments for {name}: add it to autocast_cases.SPECIAL"
            yield name, mix, args


def _emulated(device_type: str, low, cases) -> dict:
    """Outcomes under real CPU autocast with `device_type`'s policy installed by fpsim."""
    outcomes = {}
    with PolicyKernels(device_type, "cpu", low), torch.autocast("cpu", dtype=low, cache_enabled=False):
        for name, mix, args in cases:
            op = resolve_op(name)
            outcomes[name, mix] = _outcome(lambda: op(*_clone(args)))
    return outcomes


def _compare(expected: dict, emulated: dict) -> set:
    """Assert every case gives the same outcome; the ops that ran (did not raise)."""
    called = set()
    for case, want in expected.items():
        got = emulated[case]
        if want[0] == "raises":
            assert got[:2] == want[:2], (case, got, want)
            continue
        called.add(case[0])
        assert got == want, case
    return called


@pytest.mark.parametrize("device_type, key", [("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")])
def test_the_tables_hold_exactly_the_ops_torch_registers(device_type, key):
    assert set(policy(device_type)) == set(registered_ops(key))


@pytest.mark.parametrize("low", LOWS, ids=["bf16", "fp16"])
def test_the_cpu_policy_gives_what_real_cpu_autocast_gives_op_by_op(low):
    cases = list(_cases("cpu", low))
    expected = {}
    with torch.autocast("cpu", dtype=low, cache_enabled=False):
        for name, mix, args in cases:
            op = resolve_op(name)
            expected[name, mix] = _outcome(lambda: op(*_clone(args)))
    called = _compare(expected, _emulated("cpu", low, cases))
    assert called == set(policy("cpu")) - set(NOT_CALLABLE["cpu"])


@pytest.mark.parametrize("low", LOWS, ids=["bf16", "fp16"])
def test_the_cuda_policy_gives_what_cuda_autocast_gives_op_by_op(low):
    cases = list(_cases("cuda", low))
    expected = {}
    with FakeTensorMode():
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", low)
        try:
            for name, mix, args in cases:
                op, fake = resolve_op(name), on_fake_cuda(args)
                expected[name, mix] = _outcome(lambda: op(*fake))
        finally:
            torch.set_autocast_enabled("cuda", False)
    called = _compare(expected, _emulated("cuda", low, cases))
    assert called == set(policy("cuda")) - set(NOT_CALLABLE["cuda"]) - {"binary_cross_entropy"}


def test_the_cpu_policy_gives_real_cpu_autocast_values_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x, w, t = torch.randn(6, 8, generator=g), torch.randn(5, 8, generator=g), torch.tensor([0, 1, 2, 3, 4, 0])
    image, kernel = torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g)

    def calls():
        f = torch.nn.functional
        y = f.linear(x, w)
        return [y, f.conv2d(image, kernel), torch.softmax(y, -1), f.layer_norm(y, (5,)), f.cross_entropy(y, t),
                f.mse_loss(y, y.flip(0)), torch.cat([y, x[:, :5]]), torch.exp(y)]

    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        expected = calls()
    with PolicyKernels("cpu", "cpu", torch.bfloat16), torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        got = calls()
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_the_cuda_policy_refuses_binary_cross_entropy_as_cuda_autocast_does():
    x = torch.rand(3, 4)
    with PolicyKernels("cuda", "cpu", torch.float16), torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(RuntimeError) as err:
            torch.nn.functional.binary_cross_entropy(x, x)
    assert str(err.value) == BANNED_MESSAGE


def test_leaving_restores_torchs_own_cpu_autocast():
    x = torch.randn(4, 4)

    def dtypes():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return [torch.softmax(x, -1).dtype, torch.exp(x @ x).dtype, torch.cat([x, x.bfloat16()]).dtype]

    before = dtypes()
    with PolicyKernels("cuda", "cpu", torch.bfloat16):
        during = dtypes()
    assert during == [torch.float32, torch.float32, torch.float32]
    assert dtypes() == before == [torch.float32, torch.bfloat16, torch.float32]
