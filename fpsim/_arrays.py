"""Array plumbing shared by the numerics: numpy and torch behind one small interface.

The rounding engine is written once against the handful of operations below,
so numpy arrays and torch tensors (on any device) run the same numerics.
This module also decides which input types are accepted and which dtype a
result comes back in.
"""

from __future__ import annotations

import numbers

import numpy as np

from .formats import PRESETS, Format

try:  # torch is a dependency; without it, fpsim still works on numpy arrays
    import torch as _torch
except ImportError:  # pragma: no cover - torch is installed with fpsim
    _torch = None

ALLOWED_INPUTS = ("numpy float16/float32/float64 arrays and scalars, ml_dtypes arrays "
                  "(bfloat16, float8_*, float6_*, float4_*), integer arrays, Python numbers, "
                  "torch floating-point or integer tensors")


def is_torch(x) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _numpy_format(dtype: np.dtype) -> Format | None:
    """The fpsim format whose values a numpy (or ml_dtypes) float dtype holds, if any."""
    for fmt in PRESETS.values():
        native = fmt.ml_dtype
        if native is not None and np.dtype(native) == dtype:
            return fmt
    return None


def _torch_format(dtype) -> Format | None:
    for fmt in PRESETS.values():
        if fmt.torch_dtype is not None and fmt.torch_dtype == dtype:
            return fmt
    return None


def input_format(x) -> Format | None:
    """The format of a float input's dtype (None for integers); TypeError for anything else."""
    if is_torch(x):
        if x.is_complex() or x.dtype == _torch.bool:
            raise TypeError(f"cannot round a torch tensor of dtype {x.dtype}; allowed: {ALLOWED_INPUTS}")
        if x.is_floating_point():
            fmt = _torch_format(x.dtype)
            if fmt is None:
                raise TypeError(f"unsupported torch dtype {x.dtype}; allowed: {ALLOWED_INPUTS}")
            return fmt
        return None
    dtype = x.dtype
    if dtype.kind in "iu" or dtype == object:  # object arrays only come from huge Python ints
        return None
    fmt = _numpy_format(dtype)
    if fmt is None:
        raise TypeError(f"cannot round an array of dtype {dtype}; allowed: {ALLOWED_INPUTS}")
    return fmt


def as_array(x):
    """Accept a numpy array, numpy scalar, Python number or torch tensor; return (array, was_scalar)."""
    if is_torch(x):
        return x, False
    if isinstance(x, bool) or isinstance(x, np.bool_):
        raise TypeError(f"cannot round a boolean {x!r}; allowed: {ALLOWED_INPUTS}")
    if isinstance(x, numbers.Integral):
        return np.asarray(int(x), dtype=np.int64 if -2**63 <= int(x) < 2**63 else object), True
    if isinstance(x, (float, np.generic)) and not isinstance(x, np.ndarray):
        if isinstance(x, complex) or np.iscomplexobj(x):
            raise TypeError(f"cannot round complex {x!r}; allowed: {ALLOWED_INPUTS}")
        return np.asarray(x), True
    if isinstance(x, (list, tuple)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"cannot round {type(x).__name__}; allowed: {ALLOWED_INPUTS}")
    if x.dtype.kind == "b":
        raise TypeError(f"cannot round a boolean array; allowed: {ALLOWED_INPUTS}")
    if x.dtype.kind not in "iuf" and _numpy_format(x.dtype) is None:
        raise TypeError(f"cannot round an array of dtype {x.dtype}; allowed: {ALLOWED_INPUTS}")
    return x, False


def result_format(in_fmt: Format | None, fmt: Format) -> Format:
    """The dtype a result comes back in: the input's own when it holds every value of `fmt`."""
    candidates = [in_fmt] if in_fmt is not None else []
    candidates += [PRESETS["fp32"], PRESETS["fp64"]] if in_fmt is not None else [PRESETS["fp64"]]
    for candidate in candidates:
        if candidate.contains(fmt):
            return candidate
    return PRESETS["fp64"]


class Ops:
    """The few array operations the engine needs, for one backend."""

    def __init__(self, like):
        self.torch = is_torch(like)
        self.device = like.device if self.torch else None

    # bits <-> floats ---------------------------------------------------
    def float_bits(self, w):
        """Bits of a float32/float64 array as int64 (sign-extended for float32)."""
        if self.torch:
            return w.view(_torch.int32).to(_torch.int64) if w.dtype == _torch.float32 else w.view(_torch.int64)
        return w.view(np.int32).astype(np.int64) if w.dtype == np.float32 else w.view(np.int64)

    def bits_float(self, bits, like):
        """Inverse of float_bits, into the dtype of `like`."""
        if self.torch:
            if like.dtype == _torch.float32:
                return bits.to(_torch.int32).view(_torch.float32)
            return bits.view(_torch.float64)
        if like.dtype == np.float32:
            return bits.astype(np.int32).view(np.float32)
        return bits.view(np.float64)

    def floor_log2(self, w):
        """floor(log2|w|) as int64 for finite nonzero w (frexp is exact)."""
        if self.torch:
            return _torch.frexp(w)[1].to(_torch.int64) - 1
        return np.frexp(w)[1].astype(np.int64) - 1

    def to_float(self, n, like):
        return n.to(like.dtype) if self.torch else n.astype(like.dtype)

    def constant(self, value, like):
        """A 0-d array of like's dtype (keeps where() from promoting float32 to float64)."""
        if self.torch:
            return _torch.tensor(value, dtype=like.dtype, device=self.device)
        return np.asarray(value, dtype=like.dtype)

    # elementwise helpers -----------------------------------------------
    def where(self, cond, a, b):
        if self.torch:
            if not isinstance(a, _torch.Tensor):
                a = _torch.tensor(a, dtype=b.dtype if isinstance(b, _torch.Tensor) else None, device=self.device)
            return _torch.where(cond, a, b)
        return np.where(cond, a, b)

    def clip(self, x, lo=None, hi=None):
        if self.torch:
            return _torch.clamp(x, min=lo, max=hi)
        if lo is not None:  # np.maximum/np.minimum: np.clip is several times slower
            x = np.maximum(x, lo)
        return x if hi is None else np.minimum(x, hi)

    def maximum(self, x, y):
        """Elementwise max of an array and an array or scalar."""
        if self.torch:
            return _torch.clamp(x, min=y) if not isinstance(y, _torch.Tensor) else _torch.maximum(x, y)
        return np.maximum(x, y)

    def trunc(self, x):
        return _torch.trunc(x) if self.torch else np.trunc(x)

    def shift_left(self, one: int, shifts):
        if self.torch:
            return _torch.bitwise_left_shift(_torch.full_like(shifts, one), shifts)
        return np.left_shift(np.int64(one), shifts)
