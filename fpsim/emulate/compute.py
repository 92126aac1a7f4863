"""Ops on fp16/bf16 tensors computed as GPU kernels compute them: in FP32, rounded once.

A CUDA kernel on half or bfloat16 tensors loads its inputs, computes in float32 (its
"opmath" type) and rounds the result once to the output's dtype; a cuBLAS GEMM accumulates
in float32 and rounds the result once. `FP32Compute`, a TorchDispatchMode (below autograd,
so forward and backward alike), does that for every op that has an fp16 or bf16 tensor
argument: it widens those arguments (and dtype arguments naming fp16 or bf16) to float32
(exact), runs the op, and rounds each
floating output to the dtype the op would have given it (round to nearest even, overflow to
Inf: torch's cast, which fpsim's tests hold bit for bit to fpsim.quantize). Tensors keep
their real dtypes, so type promotion, autograd and saved tensors are those of a real
low-precision run. Matrix products can go to a tensor-core model instead (`gemm`).

Arguments an op writes (its schema marks them `(a!)`: self of an in-place op, out= tensors, every
tensor of a written list, as foreach ops and fused optimizers write theirs) are widened like the
others and the result is rounded back into the real tensor, resized first where the op resized its
widened copy (out= an empty tensor).

Which dtype each output gets is asked once per op and argument signature from the op's meta
kernel. Ops that only move or cast values (views, in-place view ops such as transpose_ and
squeeze_, copies, cat, indexing, ...) are exact in any dtype and run as they are, on the real
tensors, and so do ops whose result the dtype itself defines (random
sampling on its grid, nan_to_num's defaults at its limits, nextafter; `_passes`): in FP32 they
would give values torch never gives in the low dtype. An op without a meta kernel runs in the
low format, by torch, and is named in `unemulated`.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..trace import to_meta

LOW = (torch.float16, torch.bfloat16)
GEMMS = ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv")
"""Matrix products a tensor-core `gemm` computes (everything else that multiplies matrices
decomposes into these before it reaches the dispatch mode, those below apart)."""

_FUSED_PRODUCTS = ("conv", "attention", "rnn", "lstm", "gru", "addbmm")
"""Name parts of ops that multiply matrices inside one kernel (convolutions, fused attention, RNNs, a batch
of products summed into one matrix): not modelled, named in `unmodelled`."""

_EXACT = frozenset((
    "_to_copy", "copy_", "clone", "detach", "alias", "lift_fresh", "_unsafe_view", "cat", "stack", "index",
    "index_select", "gather", "masked_fill", "masked_fill_", "where", "embedding", "slice_backward",
    "select_backward", "constant_pad_nd", "_local_scalar_dense", "fill_", "zero_", "masked_select",
    "scalar_tensor", "zeros", "ones", "full", "empty", "empty_strided", "split_with_sizes",
))


_OF_THE_DTYPE = frozenset(("nan_to_num", "nextafter"))
"""Ops whose result the dtype itself defines, not arithmetic on the values: nan_to_num's default
replacements for +-Inf are the dtype's largest finite values, nextafter steps to the dtype's next value."""


def _passes(func) -> bool:
    """Whether torch's result in the low dtype is already the emulated one: the op makes no new
    values (a view; an in-place view op, torch's tag `inplace_view`, which changes only its tensor's
    sizes, strides or storage: transpose_, squeeze_, as_strided_, resize_, set_, detach_ ...; a copy),
    or the dtype defines its result (`_OF_THE_DTYPE`; and every random sampler, known by
    its Generator argument, which draws on the dtype's own grid and range: uniform_ stays below
    its upper bound, random_ within the dtype's integers)."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    return (func.is_view or torch.Tag.inplace_view in func.tags or name in _EXACT or name.endswith("_like")
            or name.startswith(("new_", "empty"))
            or name.rstrip("_") in _OF_THE_DTYPE
            or any(str(a.type) in ("Generator", "Optional[Generator]") for a in schema.arguments))


class FP32Compute(TorchDispatchMode):
    """Runs every op with an fp16/bf16 tensor argument in float32 and rounds its results (module doc).

    gemm: None (matrix products in float32 by torch, like every other op), or a callable
    `gemm(name, args, kwargs, dtype)` that returns the float32 result of a GEMM op whose
    low-precision operands are of `dtype` (widened to float32 in args), or None to decline.
    """

    def __init__(self, gemm=None):
        super().__init__()
        self.gemm = gemm
        self.unemulated: set = set()    # names of ops run by torch in the low format (no meta kernel)
        self.unmodelled: set = set()    # matrix-multiplying ops the gemm does not model (FP32 accumulation)
        self._passing: dict = {}         # op -> whether it passes through
        self._written: dict = {}         # op -> (positions, names) of the arguments it writes
        self._dtypes: dict = {}          # (op, argument signature) -> output dtypes, or None

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False   # the handler never compiles: spare each op torch._dynamo.disable's wrapper

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        passing = self._passing.get(func)
        if passing is None:
            passing = self._passing[func] = _passes(func)
        low = None if passing else _low_dtype(args, kwargs)
        if low is None:
            return func(*args, **kwargs)
        targets = self._output_dtypes(func, args, kwargs)
        if targets is None:
            return func(*args, **kwargs)
        return self._run(func, args, kwargs, targets, low)

    # ----------------------------------------------------------------- helpers
    def _run(self, func, args, kwargs, targets, low):
        positions, names = self._written_arguments(func)
        written = []

        def widen(x, writes):
            if isinstance(x, (list, tuple)):      # a written list (foreach ops, fused optimizers) writes each element
                return type(x)(widen(t, writes) for t in x)
            if isinstance(x, torch.Tensor) and x.dtype in LOW:
                wide = x.float()
                if writes:
                    written.append((x, wide))
                return wide
            return torch.float32 if x in LOW else x     # a dtype argument (input_dtype=...) too

        wide_args = tuple(widen(a, i in positions) for i, a in enumerate(args))
        wide_kwargs = {k: widen(v, k in names) for k, v in kwargs.items()}
        out = None
        name = func._schema.name.split("::")[-1]
        if self.gemm is not None and name in GEMMS:
            out = self.gemm(name, wide_args, wide_kwargs, low)
        elif self.gemm is not None and any(part in name for part in _FUSED_PRODUCTS):
            self.unmodelled.add(name)
        if out is None:
            out = func(*wide_args, **wide_kwargs)
        originals = {}
        for original, wide in written:
            if wide.shape != original.shape:    # an output torch resized (out= an empty tensor): resize the real one
                _resize_as(original, wide)
            original.copy_(wide)           # the in-place result, rounded into the real tensor
            originals[id(wide)] = original
        return _round_outputs(out, iter(targets), originals)

    def _written_arguments(self, func):
        cached = self._written.get(func)
        if cached is None:
            arguments = func._schema.arguments
            writes = [i for i, a in enumerate(arguments) if a.alias_info is not None and a.alias_info.is_write]
            cached = self._written[func] = (set(writes), {arguments[i].name for i in writes})
        return cached

    def _output_dtypes(self, func, args, kwargs):
        key = (func, _signature(args), _signature(kwargs))
        try:
            return self._dtypes[key]
        except KeyError:
            pass
        except TypeError:            # an argument that cannot be part of a key: ask the meta kernel each time
            key = None
        try:
            meta = func(*to_meta(args), **to_meta(kwargs))
            dtypes = list(_output_leaves(meta))
        except Exception:            # no meta kernel (or a data-dependent one): torch runs it as it is
            self.unemulated.add(func._schema.name.split("::")[-1])
            dtypes = None
        if key is not None:
            self._dtypes[key] = dtypes
        return dtypes


def _resize_as(original, wide):
    """Give `original` the sizes and strides the op gave `wide`, its widened copy, when it resized it as an
    output: as torch's resize_output and the kernel's strides would have done to `original` itself."""
    original.resize_(wide.shape)
    if original.stride() != wide.stride():
        original.as_strided_(wide.shape, wide.stride())


def _low_dtype(args, kwargs):
    """The fp16/bf16 dtype of the first such tensor argument, or None."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor):
            if x.dtype in LOW:
                return x.dtype
        elif isinstance(x, (list, tuple)):
            for t in x:
                if isinstance(t, torch.Tensor) and t.dtype in LOW:
                    return t.dtype
    return None


def _signature(x):
    """What decides an op's output dtypes: tensor dtypes (and whether 0-dim: those do not promote
    within a category), bools and dtype-like values; numbers count by their type only."""
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim() == 0)
    if isinstance(x, (list, tuple)):
        return tuple(_signature(v) for v in x)
    if isinstance(x, dict):
        return tuple((k, _signature(v)) for k, v in x.items())
    if isinstance(x, bool) or x is None or isinstance(x, (str, torch.dtype, torch.device, torch.layout,
                                                            torch.memory_format)):
        return x
    if isinstance(x, (int, float, complex)):
        return type(x)
    hash(x)                      # anything else counts by value, if it can be a key
    return x


def _output_leaves(out):
    """The dtype (or None for non-tensors) of every leaf of an op's output, in order."""
    if isinstance(out, (list, tuple)):
        for v in out:
            yield from _output_leaves(v)
    else:
        yield out.dtype if isinstance(out, torch.Tensor) else None


def _round_outputs(out, targets, originals):
    """`out` with each tensor leaf rounded to its target dtype; results written in place are the real tensors."""
    if isinstance(out, (list, tuple)):
        return type(out)(_round_outputs(v, targets, originals) for v in out)
    target = next(targets)
    if not isinstance(out, torch.Tensor):
        return out
    if id(out) in originals:
        return originals[id(out)]
    return out if target is None or out.dtype == target else out.to(target)
