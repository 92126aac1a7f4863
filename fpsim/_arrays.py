"""Array plumbing shared by the numerics: numpy and torch behind one small interface.

The rounding engine is written once against the handful of operations below,
so numpy arrays and torch tensors (on any device) run the same numerics.
This module also decides which inputs are accepted, how they reach the engine
(`accept`) and how a result goes back to the caller in the input's own kind,
and which dtype a result comes back in.

Every difference between the two backends lives here, so that the numerics
modules never branch on torch. torch is never imported here unless the caller
already has: a tensor can only exist once torch is loaded, so `is_torch` asks
`sys.modules` (only what makes a tensor or a torch dtype from nothing imports it).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import sys
from typing import Callable, NamedTuple

import numpy as np

from .formats import PRESETS, Format

ALLOWED_INPUTS = ("numpy float16/float32/float64 arrays and scalars (any byte order), ml_dtypes arrays "
                  "(bfloat16, float8_*, float6_*, float4_*, int4, ...), integer arrays, Python numbers and "
                  "lists of them, numpy masked arrays and matrices, torch floating-point or integer tensors, "
                  "and arrays of other libraries that implement the array API (__array_namespace__, such as "
                  "jax) or __dlpack__ / __array__")


def is_torch(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_meta(x) -> bool:
    """A torch tensor without data (shape and dtype only, as torch.compile traces with)."""
    return is_torch(x) and x.device.type == "meta"


def requires_grad(x) -> bool:
    """Whether x is a tensor that records gradients."""
    return is_torch(x) and x.requires_grad


def straight_through_of(x, compute: Callable):
    """compute(x), for a tensor that records gradients computed on x detached and attached to x's graph
    with the straight-through (identity) gradient while torch records them: the fake quantisation of
    `quantize(grad="identity")`, the block formats' and the recipes'."""
    if not requires_grad(x):
        return compute(x)
    result = compute(x.detach())
    if not grad_enabled():
        return result
    from ._autograd import straight_through

    return straight_through(x, result, None, "identity")


def detached(x):
    """x without its autograd history (a tensor's .detach(); anything else as it is)."""
    return x.detach() if is_torch(x) else x


def is_packed_fp4(x) -> bool:
    """A torch.float4_e2m1fn_x2 tensor: two E2M1 codes per byte (the first in the low nibble)."""
    return is_torch(x) and x.dtype == getattr(sys.modules["torch"], "float4_e2m1fn_x2", None)


def grad_enabled() -> bool:
    """Whether torch records gradients now (False while torch is not loaded: no tensor can need one)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.is_grad_enabled()


def dtype(name: str, torch: bool = False):
    """The numpy dtype, or with `torch` the torch dtype, named `name` ('uint16', 'float32', ...)."""
    return getattr(_torch_module(), name) if torch else np.dtype(name)


def on_device(array: np.ndarray, device):
    """A host result back as the input was: the numpy array itself (device None), or a tensor on `device`."""
    if device is None:
        return array
    array = np.asarray(array)  # 0-d stays 0-d (np.ascontiguousarray would make it 1-d)
    return _torch_module().from_numpy(array if array.flags.c_contiguous else np.ascontiguousarray(array)).to(device)


def is_generator(generator) -> bool:
    """A numpy Generator or a torch.Generator."""
    if isinstance(generator, np.random.Generator):
        return True
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(generator, torch.Generator)


def numpy_generator(generator):
    """A numpy Generator (or None) for a numpy or torch generator: a torch.Generator seeds a fresh one."""
    if generator is None or isinstance(generator, np.random.Generator):
        return generator
    torch = sys.modules.get("torch")  # a torch.Generator exists only once torch is loaded
    if torch is None or not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a numpy.random.Generator or torch.Generator, got {generator!r}")
    return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator)))


def generator_words(generator, count: int, torch_input: bool) -> list[int]:
    """`count` random 32-bit words from a numpy Generator, or a torch.Generator for torch input (advancing
    it); TypeError naming the generator when it is not of the input's kind."""
    if torch_input:
        torch = _torch_module()
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator for a torch tensor must be a torch.Generator, got {generator!r}")
        words = torch.randint(0, 1 << 32, (count,), generator=generator, device=generator.device, dtype=torch.int64)
        return [int(w) for w in words.cpu()]
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator for numpy input must be a numpy.random.Generator, got {generator!r}")
    return [int(w) for w in generator.integers(0, 1 << 32, size=count, dtype=np.uint64)]


def _torch_module():
    import torch

    return torch


@functools.lru_cache(maxsize=64)  # (by dtype: asked on every call)
def _numpy_format(dtype: np.dtype) -> Format | None:
    """The fpsim format whose values a numpy (or ml_dtypes) float dtype holds, if any."""
    if dtype.kind not in "fV":
        return None
    for fmt in PRESETS.values():
        native = fmt.ml_dtype
        if native is not None and np.dtype(native) == dtype:
            return fmt
    return None


@functools.cache
def _torch_bit_layouts() -> tuple:
    """({element size: torch int dtype of that size}, {torch float dtype: bits of its positive quiet NaN})."""
    torch = sys.modules["torch"]
    return ({2: torch.int16, 4: torch.int32, 8: torch.int64},
            {torch.float16: 0x7E00, torch.bfloat16: 0x7FC0, torch.float32: 0x7FC00000,
             torch.float64: 0x7FF8000000000000})


@functools.lru_cache(maxsize=64)
def _torch_format(dtype) -> Format | None:
    for fmt in PRESETS.values():
        if fmt.torch_dtype is not None and fmt.torch_dtype == dtype:
            return fmt
    return None


def integers_as_float64(array: np.ndarray) -> tuple:
    """(float64 values, the index of the first element float64 does not hold exactly, or None) of a numpy
    integer or object array (Python ints beyond int64, Fractions, floats): integers are compared as integers,
    so that one float64 would round (2^53 + 1 to 2^53) is found, where a check after the conversion sees the
    rounded value (2^60 is a float64, 2^60 + 1 is not). Float arrays: their float64 values, None."""
    if array.dtype.kind == "O":
        values = np.empty(array.shape, dtype=np.float64)
        for index, v in np.ndenumerate(array):
            try:
                f = float(v)
            except OverflowError:          # an integer beyond float64's range
                return values, index
            if not (f == v or f != f):      # (== of an int or a Fraction with a float is exact)
                return values, index
            values[index] = f
        return values, None
    values = array.astype(np.float64)
    if array.dtype.kind not in "iu" or array.dtype.itemsize < 8:     # every int32 is a float64
        return values, None
    top = 2.0 ** (64 - (array.dtype.kind == "i"))
    inside = values < top                                 # (the type's max rounds up to top, outside it)
    inexact = ~inside | (np.where(inside, values, 0).astype(array.dtype) != array)
    if not inexact.any():
        return values, None
    return values, tuple(int(i) for i in np.argwhere(inexact)[0])


def input_format(x) -> Format | None:
    """The format of a float input's dtype (None for integers); TypeError for anything else."""
    if is_torch(x):
        torch = sys.modules["torch"]
        if x.is_complex() or x.dtype == torch.bool:
            raise TypeError(f"cannot round a torch tensor of dtype {x.dtype}; allowed: {ALLOWED_INPUTS}")
        if x.dtype == getattr(torch, "float4_e2m1fn_x2", None):
            raise TypeError("a torch.float4_e2m1fn_x2 tensor holds two packed E2M1 codes per element; "
                            "fpsim.decode(t, 'e2m1') unpacks them into values")
        if x.is_floating_point():
            fmt = _torch_format(x.dtype)
            if fmt is None:
                raise TypeError(f"unsupported torch dtype {x.dtype}; allowed: {ALLOWED_INPUTS}")
            return fmt
        return None
    dtype = x.dtype
    if dtype.kind in "iu" or dtype == object:  # object arrays hold Python numbers beyond int64
        return None
    fmt = _numpy_format(dtype)
    if fmt is None:
        raise TypeError(f"cannot round an array of dtype {dtype}; allowed: {ALLOWED_INPUTS}")
    return fmt


class Accepted(NamedTuple):
    """An input as the engine takes it, and how the engine's result goes back to the caller."""

    array: object                    # numpy ndarray (native byte order) or torch tensor
    give_back: Callable[[object], object]


def _same(result):
    return result


def accept(x, stochastic: bool = False) -> Accepted:
    """Turn any accepted input into a numpy array or torch tensor; TypeError for anything else.

    Nothing is changed in place: byte-swapped, masked and foreign arrays are copied or viewed.
    The result comes back as the input's kind: a scalar for a scalar, a masked array with the
    same mask, a matrix, an array of the input's array-API library, a DTensor on the same mesh
    with the same placements. stochastic: the caller draws random bits by element index.
    """
    if type(x) is np.ndarray:  # the common case first (each check below costs a call's time)
        return Accepted(_plain(x), _same if x.flags.c_contiguous else _layout_of(x))
    if is_torch(x):
        if type(x).__name__ == "DTensor":
            return _dtensor(x, stochastic)
        return Accepted(x, _same if x.is_contiguous() else _layout_of(x))
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"cannot round a boolean {x!r}; allowed: {ALLOWED_INPUTS}")
    if isinstance(x, numbers.Integral):
        value = int(x)
        return Accepted(np.asarray(value, dtype=np.int64 if -2**63 <= value < 2**63 else object), _scalar)
    if isinstance(x, (complex, np.complexfloating)):
        raise TypeError(f"cannot round complex {x!r}; allowed: {ALLOWED_INPUTS}")
    if isinstance(x, (float, np.generic)):
        return Accepted(_plain(np.asarray(x)), _scalar)
    if isinstance(x, (list, tuple)):
        return Accepted(_plain(_from_sequence(x)), _same)
    if isinstance(x, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(x).copy()
        data = _plain(np.ma.getdata(x))
        if mask.any():  # masked slots may hold anything (NaN where the format has none): round zeros
            data = np.where(mask, np.zeros((), data.dtype), data)
        return Accepted(data, lambda result: np.ma.MaskedArray(result, mask=mask))
    if isinstance(x, np.matrix):
        return Accepted(_plain(np.asarray(x)), np.asmatrix)
    if isinstance(x, np.ndarray):
        return Accepted(_plain(x.view(np.ndarray)), _same)
    if hasattr(x, "__array_namespace__") or hasattr(x, "__dlpack__") or hasattr(x, "__array__"):
        return _foreign(x)
    raise TypeError(f"cannot round {type(x).__name__}; allowed: {ALLOWED_INPUTS}")


def _dtensor(x, stochastic: bool) -> Accepted:
    """A DTensor (torch.distributed: sharded or replicated): its local part, and the result put back on its
    mesh with its placements. Rounding element by element commutes with sharding and replication, but not
    with a pending sum (a Partial placement), and stochastic rounding's draws follow the index in the local
    part (the same on every shard, where a replica needs the same key on every rank): both refused."""
    placements = tuple(x.placements)
    if any(p.is_partial() for p in placements):
        raise ValueError(f"cannot round a DTensor with a pending sum (placements {placements}): reduce it first "
                         f"(x.redistribute(placements=[Replicate()]) or x.full_tensor())")
    if stochastic:
        raise ValueError("stochastic rounding of a DTensor: round x.full_tensor(), or x.to_local() with a seed "
                         "of each rank's own (its draws follow the index in the local part)")
    inner = accept(x.to_local())        # (differentiable: a gradient reaches x)

    def give_back(result):
        return type(x).from_local(inner.give_back(result), x.device_mesh, placements, shape=x.shape,
                                  stride=x.stride())
    return Accepted(inner.array, give_back)


def _layout_of(x):
    """The give_back of an array or tensor not in row-major order: the result in x's memory layout (a
    Fortran-ordered array, a channels_last tensor), as numpy's astype and torch's elementwise ops give it;
    the engine works in row-major order."""
    def give_back(result):
        if is_torch(result):
            out = sys.modules["torch"].empty_like(x, dtype=result.dtype)    # (preserve_format)
            return result if out.stride() == result.stride() else out.copy_(result)
        if not isinstance(result, np.ndarray) or result.shape != x.shape:
            return result
        out = np.empty_like(x, dtype=result.dtype)                         # (order "K")
        if out.strides == result.strides:
            return result
        out[...] = result
        return out
    return give_back


def _scalar(result):
    return result[()] if isinstance(result, np.ndarray) else result


def _plain(array: np.ndarray) -> np.ndarray:
    """A numpy array of a dtype the engine takes: native byte order, ml_dtypes integers widened."""
    dtype = array.dtype
    if dtype.kind == "b":
        raise TypeError(f"cannot round a boolean array; allowed: {ALLOWED_INPUTS}")
    if dtype.kind == "c":
        raise TypeError(f"cannot round a complex array (dtype {dtype}); allowed: {ALLOWED_INPUTS}")
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    if dtype.kind == "V":  # ml_dtypes' own types: floats are formats, int4/uint4/... are integers
        if _numpy_format(array.dtype) is None:
            name = array.dtype.name
            if name.startswith(("int", "uint")):
                return array.astype(np.uint8 if name.startswith("u") else np.int8)
            raise TypeError(f"cannot round an array of dtype {array.dtype}; allowed: {ALLOWED_INPUTS}")
    elif dtype.kind not in "iufO":
        raise TypeError(f"cannot round an array of dtype {array.dtype}; allowed: {ALLOWED_INPUTS}")
    if dtype == object:
        _check_objects(array)
    return array


def _from_sequence(values) -> np.ndarray:
    """A list or tuple as an array; Python ints beyond int64 keep their exact value (object array)."""
    try:
        array = np.asarray(values)
    except OverflowError:
        array = np.asarray(values, dtype=object)
    if array.dtype.kind == "f" and _has_big_int(values):  # [0.5, 2**60 + 1] would be rounded to float64
        array = np.asarray(values, dtype=object)
    return array


def _has_big_int(values) -> bool:
    for v in values:
        if isinstance(v, (list, tuple)):
            if _has_big_int(v):
                return True
        elif isinstance(v, numbers.Integral) and abs(int(v)) > 2**53:
            return True
    return False


def _check_objects(array: np.ndarray) -> None:
    for v in array.ravel():
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Integral, float, np.floating)):
            raise TypeError(f"cannot round {type(v).__name__} {v!r} in an object array; allowed: "
                            f"Python ints and floats")


def _foreign(x) -> Accepted:
    """An array of another library: rounded through numpy (or torch, for device memory), given back
    through the library's array-API namespace where it has one, else as a numpy array."""
    namespace = x.__array_namespace__() if hasattr(x, "__array_namespace__") else None
    on_host = True
    if hasattr(x, "__dlpack_device__"):
        on_host = int(x.__dlpack_device__()[0]) == 1  # kDLCPU
    if on_host:
        array = _plain(np.asarray(x))
        back = (lambda result: namespace.asarray(result)) if namespace is not None else _same
        return Accepted(array, back)
    import torch  # device memory: torch reads it in place through DLPack

    array = torch.from_dlpack(x)
    if namespace is None:
        return Accepted(array, _same)
    return Accepted(array, lambda result: namespace.from_dlpack(result))


def result_format(in_fmt: Format | None, fmt: Format) -> Format:
    """The dtype a result comes back in: the input's own when it holds every value of `fmt`."""
    candidates = [in_fmt] if in_fmt is not None else []
    candidates += [PRESETS["fp32"], PRESETS["fp64"]] if in_fmt is not None else [PRESETS["fp64"]]
    for candidate in candidates:   # (and its infinities: E4M3FN holds E4M3 IEEE's finite values, not its Inf)
        if candidate.contains(fmt) and (candidate.infinities or not fmt.infinities):
            return candidate
    return PRESETS["fp64"]


class Ops:
    """The few array operations the engine needs, for one backend."""

    def __init__(self, like):
        self.torch = is_torch(like)
        self.device = like.device if self.torch else None
        self._torch = sys.modules["torch"] if self.torch else None

    # bits <-> floats ---------------------------------------------------
    def float_bits(self, w):
        """Bits of a float32/float64 array as int64 (sign-extended for float32)."""
        if self.torch:
            torch = self._torch
            return w.view(torch.int32).to(torch.int64) if w.dtype == torch.float32 else w.view(torch.int64)
        return w.view(np.int32).astype(np.int64) if w.dtype == np.float32 else w.view(np.int64)

    def bits_float(self, bits, like):
        """Inverse of float_bits, into the dtype of `like`."""
        if self.torch:
            torch = self._torch
            if like.dtype == torch.float32:
                return bits.to(torch.int32).view(torch.float32)
            return bits.view(torch.float64)
        if like.dtype == np.float32:
            return bits.astype(np.int32).view(np.float32)
        return bits.view(np.float64)

    def floor_log2(self, w):
        """floor(log2|w|) as int64 for finite nonzero w (frexp is exact)."""
        if self.torch:
            return self._torch.frexp(w)[1].to(self._torch.int64) - 1
        return np.frexp(w)[1].astype(np.int64) - 1

    def to_float(self, n, like):
        return n.to(like.dtype) if self.torch else n.astype(like.dtype)

    def constant(self, value, like):
        """A 0-d array of like's dtype (keeps where() from promoting float32 to float64)."""
        if self.torch:
            return self._torch.tensor(value, dtype=like.dtype, device=self.device)
        return np.asarray(value, dtype=like.dtype)

    # dtypes, shapes, host ----------------------------------------------
    def astype(self, x, dtype: str):
        """x converted to the dtype named `dtype` ('float64', 'float32', 'int16', ...)."""
        if self.torch:
            return self._nan_signs_kept(x.to(getattr(self._torch, dtype)), x)
        return np.asarray(x).astype(dtype, copy=False)

    def as_dtype_of(self, x, fmt: Format):
        """x in the native dtype that holds `fmt` (torch dtype, or numpy/ml_dtypes type)."""
        if self.torch:
            return self._nan_signs_kept(x.to(fmt.torch_dtype), x)
        target = np.dtype(fmt.ml_dtype)
        return x if x.dtype == target else x.astype(target)

    def _nan_signs_kept(self, out, source):
        """A torch cast's result with each NaN the quiet NaN of the sign of the NaN it came from (as numpy's
        casts give): torch's casts to bfloat16 give every NaN one pattern, and float16 ones lose a NaN's
        sign outside their vector loop."""
        torch = self._torch
        ints, quiet = _torch_bit_layouts()
        if out is source or out.dtype not in quiet or source.element_size() not in ints or \
                not source.is_floating_point():
            return out
        nan = torch.isnan(source)
        if out.device.type == "cpu" and not bool(nan.any()):
            return out
        negative = source.view(ints[source.element_size()]) < 0
        kind = ints[out.element_size()]
        positive = torch.tensor(quiet[out.dtype], dtype=kind, device=out.device)
        signed = torch.where(negative, positive | torch.iinfo(kind).min, positive)
        return torch.where(nan, signed, out.view(kind)).view(out.dtype)

    def check_same(self, x, name: str) -> None:
        """TypeError unless `x` is of this backend (numpy with numpy, torch with torch)."""
        if self.torch != is_torch(x):
            raise TypeError(f"{name} must be the same array type as the first operand (numpy or torch)")

    def array(self, x):
        """x as this backend's array (np.asarray for numpy; a tensor as it is)."""
        return x if self.torch else np.asarray(x)

    def zeros(self, shape, dtype: str):
        if self.torch:
            return self._torch.zeros(tuple(shape), dtype=getattr(self._torch, dtype), device=self.device)
        return np.zeros(tuple(shape), dtype=dtype)

    def zeros_like(self, x):
        return self._torch.zeros_like(x) if self.torch else np.zeros_like(x)

    def concat(self, parts, axis: int = 0):
        return self._torch.cat(list(parts), axis) if self.torch else np.concatenate(list(parts), axis)

    def stack(self, parts, axis: int = 0):
        return self._torch.stack(list(parts), axis) if self.torch else np.stack(list(parts), axis)

    def arange(self, n: int):
        """0 .. n-1 as int64."""
        if self.torch:
            return self._torch.arange(n, dtype=self._torch.int64, device=self.device)
        return np.arange(n, dtype=np.int64)

    def full_like(self, x, value):
        return self._torch.full_like(x, value) if self.torch else np.full_like(x, value)

    def empty(self, shape, dtype: "str | Format"):
        """An uninitialised array of the dtype named `dtype`, or of the native dtype that holds a Format
        (on a meta device: shape and dtype only, the result of a traced call)."""
        if self.torch:
            native = dtype.torch_dtype if isinstance(dtype, Format) else getattr(self._torch, dtype)
            return self._torch.empty(tuple(shape), dtype=native, device=self.device)
        return np.empty(tuple(shape), dtype=np.dtype(dtype.ml_dtype) if isinstance(dtype, Format) else dtype)

    def is_floating(self, x) -> bool:
        return x.is_floating_point() if self.torch else x.dtype.kind == "f" or _numpy_format(x.dtype) is not None

    def isnan(self, x):
        return self._torch.isnan(x) if self.torch else np.isnan(x)

    def first_index(self, mask) -> tuple:
        """The index of the first True element of a boolean array (of a 0-d one: ())."""
        if self.torch:
            flat = mask.reshape(-1).nonzero()
            index = int(flat[0]) if len(flat) else 0
            return tuple(int(i) for i in np.unravel_index(index, tuple(mask.shape))) if mask.dim() else ()
        return tuple(int(i) for i in np.argwhere(mask)[0]) if mask.ndim else ()

    def repeat(self, x, count: int):
        """Each value along the last axis repeated `count` times."""
        return x.repeat_interleave(count, dim=-1) if self.torch else np.repeat(x, count, axis=-1)

    def is_integer(self, x) -> bool:
        """Whether x holds integers (neither floats, complex numbers nor booleans)."""
        if self.torch:
            return not (x.is_floating_point() or x.is_complex() or x.dtype == self._torch.bool)
        return x.dtype.kind in "iu"

    def int64_bits(self, x):
        """Integers as int64; uint64 reinterpreted bit for bit (2^63 and above become negative)."""
        if self.torch:
            torch = self._torch
            return x.view(torch.int64) if x.dtype == torch.uint64 else x.to(torch.int64)
        return x.view(np.int64) if x.dtype == np.uint64 else x.astype(np.int64)

    def view(self, x, dtype: str):
        """x's bits read as the dtype named `dtype` (of the same width)."""
        return x.view(getattr(self._torch, dtype)) if self.torch else x.view(np.dtype(dtype))

    def host_values(self, x) -> np.ndarray:
        """A numpy array holding x's values exactly: a numpy array as it is; a tensor copied to the host
        in float64 (float64 tensors), float32 (the narrower floats) or int64 (integer tensors)."""
        if not self.torch:
            return x
        torch = self._torch
        x = x.detach().cpu()
        if not x.is_floating_point():
            return x.to(torch.int64).numpy()
        return (x if x.dtype == torch.float64 else x.float()).numpy()

    def quiet_float_errors(self):
        """numpy's overflow/invalid warnings off (lanes the caller replaces); torch warns of none, and
        torch.compile traces no numpy context."""
        return contextlib.nullcontext() if self.torch else np.errstate(over="ignore", invalid="ignore")

    @property
    def on_host(self) -> bool:
        """Whether the arrays live in host memory (numpy, or CPU tensors): the compiled kernel's reach."""
        return not self.torch or self.device.type == "cpu"

    def flat_nonzero(self, mask):
        """Indices of the true elements of a 1-d mask, as an int64 array of this backend."""
        return mask.nonzero().reshape(-1) if self.torch else np.flatnonzero(mask)

    def to_host(self, x) -> np.ndarray:
        """A numpy array of x's values (a copy from the device for tensors)."""
        return x.detach().cpu().numpy() if self.torch else np.asarray(x)

    def from_host(self, array: np.ndarray):
        """A host numpy array as this backend's array (on its device)."""
        if not self.torch:
            return array
        return self._torch.from_numpy(np.ascontiguousarray(array).reshape(array.shape)).to(self.device)  # (0-d too)

    # reductions --------------------------------------------------------
    def amax(self, x, axis: int = -1):
        return x.amax(axis) if self.torch else x.max(axis)

    def sum(self, x, axis: int = -1, dtype: str | None = None):
        if self.torch:
            return x.sum(axis, dtype=getattr(self._torch, dtype) if dtype else None)
        return x.sum(axis, dtype=dtype)

    # elementwise helpers -----------------------------------------------
    def trunc_(self, x):
        """x truncated toward zero, in place."""
        return self._torch.trunc(x, out=x) if self.torch else np.trunc(x, out=x)

    def pow2(self, exponent, like):
        """Exact 2^exponent (an integer array) in like's float dtype."""
        if self.torch:
            one = self._torch.ones((), dtype=like.dtype, device=like.device)
            return self._torch.ldexp(one, exponent.to(like.dtype))
        return np.ldexp(like.dtype.type(1), exponent.astype(np.int32))

    def nextafter(self, x, toward):
        if self.torch:
            return self._torch.nextafter(x, toward if isinstance(toward, self._torch.Tensor) else
                                         self._torch.full_like(x, toward))
        return np.nextafter(x, np.asarray(toward, dtype=x.dtype))

    def where(self, cond, a, b):
        if self.torch:
            torch = self._torch
            if not isinstance(a, torch.Tensor):
                a = torch.tensor(a, dtype=b.dtype if isinstance(b, torch.Tensor) else None, device=self.device)
            return torch.where(cond, a, b)
        return np.where(cond, a, b)

    def clip(self, x, lo=None, hi=None):
        if self.torch:
            return self._torch.clamp(x, min=lo, max=hi)
        if lo is not None:  # np.maximum/np.minimum: np.clip is several times slower
            x = np.maximum(x, lo)
        return x if hi is None else np.minimum(x, hi)

    def maximum(self, x, y):
        """Elementwise max of an array and an array or scalar."""
        if self.torch:
            torch = self._torch
            return torch.clamp(x, min=y) if not isinstance(y, torch.Tensor) else torch.maximum(x, y)
        return np.maximum(x, y)

    def trunc(self, x):
        return self._torch.trunc(x) if self.torch else np.trunc(x)

    def shift_left(self, one: int, shifts):
        if self.torch:
            return self._torch.bitwise_left_shift(self._torch.full_like(shifts, one), shifts)
        return np.left_shift(np.int64(one), shifts)
