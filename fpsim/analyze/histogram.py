"""Exact log2-magnitude histograms: counted in one pass per tensor, read as numpy.

Counting (`Log2Counter.count`) reads the bits of each value: the float32
exponent field F of its exact float32 widening and whether the mantissa bits
are all zero. So bin e holds the values with 2^e <= |x| < 2^(e+1) exactly (no
log2 rounding), and inside each bin the exact powers of two (|x| == 2^e) are
counted apart: they are the values that tie when a format's rounding-to-zero
threshold (min_subnormal / 2) is a power of two, which it always is. Zeros,
+Inf, -Inf and NaN get their own counts.

Two engines give the same counts, bit for bit (the tests hold them to each
other and to an independent numpy count):
- the compiled kernel (fpsim/_fasthist.c) for float32, float16 and bfloat16
  tensors on the CPU: one pass over the tensor's own bits (no widening copy),
  counts, amax and (on request) the mass per binade together;
- torch operations on the tensor's device for everything else (CUDA, float64,
  tensor subclasses, or no compiler at install): a handful of elementwise
  integer passes and one bincount, no host synchronisation (on CUDA the
  counts go through index_add_, because bincount reads the maximum back).

Float32 subnormals (nonzero |x| < 2^-126) are counted exactly but not split
into binades: that would cost a second pass over every tensor, and such
values lie below every fp16/fp8 threshold. Fractions treat them
conservatively (see `Log2Histogram.underflow`). float64 tensors are counted
from their own bits, with magnitudes below 2^-126 joining the same `tiny`
count and finite magnitudes of 2^128 or more counted as `huge`.

The raw layout (RAW_SIZE int64 counters) is
``index = (sign << 9 | F << 1 | mantissa_nonzero)`` for the 1024 float32
classes, then two `huge` counters (+, -) used only by float64 input. The mass
layout (MASS_SIZE float64) is the sum of |x| per exponent field F (0: the
tiny values; 255: the float64 values of 2^128 and more), then the sum of x^2
per F; Inf and NaN carry no mass. It gives the share of a tensor's L1 and L2
norm below or above any power of two (what a format flushes or clips).
"""

from __future__ import annotations

import dataclasses
import functools
import threading

import numpy as np

try:
    from .. import _fasthist
except ImportError:  # built without a compiler: torch operations count everything
    _fasthist = None

E_LO = -126
"""Lowest binade with its own bin: float32's smallest normal exponent."""
E_HI = 127
"""Highest binade of float32."""
N_BINS = E_HI - E_LO + 1
RAW_SIZE = 1026
MASS_SIZE = 512
TINY_LOG2_RANGE = (-149, -126)
"""The magnitudes [2^-149, 2^-126) of float32 subnormals, counted together as `tiny`."""

_F32_MANTISSA = 0x7FFFFF
_F64_MANTISSA = (1 << 52) - 1


def kernel_available() -> bool:
    """Whether the compiled counting kernel was built."""
    return _fasthist is not None


def dense_counts(pairs: bytes) -> np.ndarray:
    """The kernel's compact counts (int64 (class, count) pairs) as int64[RAW_SIZE]."""
    packed = np.frombuffer(pairs, dtype=np.int64).reshape(-1, 2)
    counts = np.zeros(RAW_SIZE, dtype=np.int64)
    counts[packed[:, 0]] = packed[:, 1]
    return counts


def _index_f32(flat, scratch=None):
    """sign << 9 | exponent field << 1 | (mantissa != 0), as int32, for a flat float32 tensor.

    scratch: two int32 buffers at least as long (reused on the CPU, where fresh
    large tensors cost page faults).
    """
    import torch

    bits = flat.view(torch.int32)
    if scratch is None:
        sign_exponent2 = bits >> 22
        mantissa_nonzero = bits & _F32_MANTISSA
    else:
        n = flat.numel()
        sign_exponent2 = torch.bitwise_right_shift(bits, 22, out=scratch[0][:n])
        mantissa_nonzero = torch.bitwise_and(bits, _F32_MANTISSA, out=scratch[1][:n])
    sign_exponent2.bitwise_and_(0x3FE)
    return sign_exponent2.add_(mantissa_nonzero.clamp_max_(1))


class Log2Counter:
    """Counts tensors into the RAW_SIZE layout, with the compiled kernel where it applies (see the module doc).

    kernel: use the compiled kernel for CPU tensors (default: when it was built);
    False counts everything with torch operations (the reference the tests hold
    the kernel to).
    """

    def __init__(self, kernel: bool | None = None):
        import torch

        if kernel and _fasthist is None:
            raise ValueError("kernel=True, but fpsim's counting kernel was not built (no C compiler at install)")
        self.kernel = _fasthist is not None if kernel is None else bool(kernel)
        self._f64_maps = {}
        self._local = threading.local()  # per-thread scratch buffers (hooks may run in autograd threads)
        self.plain = (torch.Tensor, torch.nn.Parameter)    # what on_host checks, at hand (it runs per tensor)
        self._strided = torch.strided
        self._kinds = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

    def _scratch(self, n: int):
        import torch

        buffers = getattr(self._local, "buffers", None)
        if buffers is None or buffers[0].numel() < n:
            buffers = (torch.empty(n, dtype=torch.int32), torch.empty(n, dtype=torch.int32))
            self._local.buffers = buffers
        return buffers

    def on_host(self, x) -> bool:
        """Whether the compiled kernel reads `x`: a plain contiguous float32/16/bf16 CPU tensor (numpy counts
        and a float amax from `count`, compact pairs from `count_pairs`)."""
        return (self.kernel and x.__class__ in self.plain and x.is_cpu and x.dtype in self._kinds
                and x.layout is self._strided and x.is_contiguous() and not x.is_neg())

    def kind_of(self, x) -> int:
        """The kernel's code for the dtype of a tensor `on_host` accepts (0 float32, 1 float16, 2 bfloat16)."""
        return self._kinds[x.dtype]

    def count_pairs(self, x, mass=None):
        """(amax, pairs) of a tensor `on_host` accepts: the kernel's compact counts (see dense_counts); its mass
        per binade added to `mass` (float64[MASS_SIZE]) when given."""
        if mass is None:
            return _fasthist.count(x.data_ptr(), x.numel(), self._kinds[x.dtype])
        return _fasthist.count(x.data_ptr(), x.numel(), self._kinds[x.dtype], mass)

    def count(self, x, mass: bool = False):
        """(counts, amax) of a floating tensor, or (counts, amax, mass) with `mass`; nothing read back to the host.

        counts: int64[RAW_SIZE]; amax: the largest magnitude, NaN when the tensor
        holds a NaN, Inf when it holds an Inf; mass: float64[MASS_SIZE]. From the
        kernel (see `on_host`) they are numpy arrays and a float (already on the
        host); otherwise torch tensors on the tensor's device.
        """
        if self.on_host(x):
            return self._count_on_host(x, mass)
        return self._count_on_device(x, mass)

    def _count_on_host(self, x, mass: bool):
        if not mass:
            amax, pairs = self.count_pairs(x)
            return dense_counts(pairs), amax
        masses = np.zeros(MASS_SIZE, dtype=np.float64)
        amax, pairs = self.count_pairs(x, masses)
        return dense_counts(pairs), amax, masses

    def _count_on_device(self, x, mass: bool):
        import torch

        flat = x.resolve_neg().reshape(-1)       # (a negative-bit view's bits are not its values')
        if flat.dtype == torch.float64:
            raw = self._bincount(self._index_f64(flat), 8192)
            counts = torch.zeros(RAW_SIZE, dtype=torch.int64, device=raw.device).index_add_(
                0, self._f64_map(raw.device), raw)
            field = ((flat.view(torch.int64) >> 52) & 0x7FF) - 896   # float32 exponent field of the value
        else:
            if flat.dtype != torch.float32:
                flat = flat.float()
            scratch = self._scratch(flat.numel()) if flat.device.type == "cpu" else None
            counts = self._bincount(_index_f32(flat, scratch), RAW_SIZE)
            field = (flat.view(torch.int32) >> 23) & 0xFF
        low, high = torch.aminmax(flat)
        amax = torch.maximum(high, -low)
        if not mass:
            return counts, amax
        finite = torch.isfinite(flat)
        field = field.clamp(0, 255).long()
        magnitude = torch.where(finite, flat.abs().double(), 0.0)
        masses = torch.zeros(MASS_SIZE, dtype=torch.float64, device=flat.device)
        masses[:256].index_add_(0, field, magnitude)
        masses[256:].index_add_(0, field, magnitude * magnitude)
        return counts, amax, masses

    @staticmethod
    def _bincount(idx, size: int):
        import torch

        if idx.device.type == "cpu":
            return torch.bincount(idx, minlength=size)
        counts = torch.zeros(size, dtype=torch.int64, device=idx.device)  # bincount would read max(idx) back
        return counts.index_add_(0, idx, torch.ones(1, dtype=torch.int64, device=idx.device).expand(idx.numel()))

    @staticmethod
    def _index_f64(x):
        import torch

        bits = x.view(torch.int64)
        sign_exponent = (bits >> 52) & 0xFFF
        mantissa_nonzero = (bits & _F64_MANTISSA) != 0
        return torch.add(mantissa_nonzero, sign_exponent, alpha=2)

    def _f64_map(self, device):
        """Where each float64 class (sign, 11-bit exponent, mantissa nonzero) lands in the float32 layout."""
        key = str(device)
        if key not in self._f64_maps:
            import torch

            table = np.empty(8192, dtype=np.int64)
            for sign in (0, 1):
                for e11 in range(2048):
                    for flag in (0, 1):
                        e = e11 - 1023
                        if e11 == 0:
                            f32, f32_flag = 0, flag          # zero, or a float64 subnormal: tiny
                        elif e11 == 2047:
                            f32, f32_flag = 255, flag        # Inf / NaN
                        elif e < E_LO:
                            f32, f32_flag = 0, 1             # tiny
                        elif e > E_HI:
                            table[(sign << 12 | e11 << 1) | flag] = 1024 + sign
                            continue
                        else:
                            f32, f32_flag = e + 127, flag
                        table[(sign << 12 | e11 << 1) | flag] = sign << 9 | f32 << 1 | f32_flag
            self._f64_maps[key] = torch.from_numpy(table).to(device)
        return self._f64_maps[key]


@dataclasses.dataclass(frozen=True)
class Log2Histogram:
    """Counts of a set of values by binade, read from the raw device counters.

    counts[i]: values with 2^e <= |x| < 2^(e+1) for e = E_LO + i; pow2[i]: of
    those, the ones equal to ±2^e exactly. tiny: nonzero |x| < 2^-126 (float32
    subnormals). huge: finite |x| >= 2^128 (float64 input only). zeros, pos_inf,
    neg_inf, nan: the special values, apart from everything else.
    """

    counts: np.ndarray
    pow2: np.ndarray
    tiny: int = 0
    huge: int = 0
    zeros: int = 0
    pos_inf: int = 0
    neg_inf: int = 0
    nan: int = 0

    @classmethod
    def from_raw(cls, raw) -> "Log2Histogram":
        raw = np.asarray(raw, dtype=np.int64)
        if raw.shape != (RAW_SIZE,):
            raise ValueError(f"raw counts must have shape ({RAW_SIZE},), got {raw.shape}")
        table = raw[:1024].reshape(2, 256, 2)  # sign, exponent field, mantissa nonzero
        both = table.sum(axis=0)
        return cls(
            counts=both[1:255].sum(axis=1).copy(),
            pow2=both[1:255, 0].copy(),
            tiny=int(both[0, 1]),
            huge=int(raw[1024] + raw[1025]),
            zeros=int(both[0, 0]),
            pos_inf=int(table[0, 255, 0]),
            neg_inf=int(table[1, 255, 0]),
            nan=int(both[255, 1]),
        )

    @classmethod
    def empty(cls) -> "Log2Histogram":
        return cls(np.zeros(N_BINS, dtype=np.int64), np.zeros(N_BINS, dtype=np.int64))

    def __add__(self, other: "Log2Histogram") -> "Log2Histogram":
        return Log2Histogram(self.counts + other.counts, self.pow2 + other.pow2, self.tiny + other.tiny,
                             self.huge + other.huge, self.zeros + other.zeros, self.pos_inf + other.pos_inf,
                             self.neg_inf + other.neg_inf, self.nan + other.nan)

    # ------------------------------------------------------------ totals
    @functools.cached_property
    def _cumulative(self) -> list:
        """[count of the bins below i for i in 0..N_BINS] as Python ints: every fraction is one or two lookups
        (a report asks each histogram thousands of them; the histogram never changes)."""
        return [0, *np.cumsum(self.counts).tolist()]

    @functools.cached_property
    def _cumulative_array(self) -> np.ndarray:
        """`_cumulative` as an int64 array, for lookups at many scales at once."""
        return np.array(self._cumulative, dtype=np.int64)

    @functools.cached_property
    def nonzero(self) -> int:
        """Finite nonzero values: the denominator of every fraction."""
        return self._cumulative[-1] + self.tiny + self.huge

    @property
    def total(self) -> int:
        return self.nonzero + self.zeros + self.pos_inf + self.neg_inf + self.nan

    @property
    def nonfinite(self) -> int:
        return self.pos_inf + self.neg_inf + self.nan

    def top_exponent(self, below: int | None = None) -> int | None:
        """Binade of the largest finite nonzero value (E_HI + 1 for `huge`), None when there is none; with
        `below`, of the largest below binade `below` (`huge` and the binades from `below` up left out)."""
        if self.huge and below is None:
            return E_HI + 1
        counts = self.counts if below is None else self.counts[:max(0, min(below - E_LO, N_BINS))]
        nonempty = np.flatnonzero(counts)
        if nonempty.size:
            return int(nonempty[-1]) + E_LO
        return TINY_LOG2_RANGE[0] if self.tiny else None

    def bottom_exponent(self) -> int | None:
        """Binade of the smallest nonzero value (-149 when float32 subnormals are present)."""
        if self.tiny:
            return TINY_LOG2_RANGE[0]
        nonempty = np.flatnonzero(self.counts)
        if nonempty.size:
            return int(nonempty[0]) + E_LO
        return E_HI + 1 if self.huge else None

    # ----------------------------------------------- format fractions (counts)
    def _below(self, edge: int, scale: int) -> int:
        """Count of binned values with e + scale < edge."""
        i = edge - scale - E_LO
        return self._cumulative[max(0, min(i, N_BINS))]

    def _at(self, array: np.ndarray, e: int) -> int:
        i = e - E_LO
        return int(array[i]) if 0 <= i < N_BINS else 0

    def underflow(self, limits, scale: int = 0) -> int:
        """Nonzero values that round to zero in the format after multiplying by 2^scale.

        Exact for binned values: every binade below the format's zero threshold
        2^z (z = log2(min_subnormal) - 1), plus the exact powers of two 2^z when
        the format rounds that tie to zero. `tiny` values count as underflow unless
        all of them survive (2^-149 * 2^scale > 2^z): conservative, and exact
        whenever their range lies wholly on one side.
        """
        z = limits.zero_exponent
        count = self._below(z, scale)
        if limits.tie_to_zero:
            count += self._at(self.pow2, z - scale)
        if TINY_LOG2_RANGE[0] + scale <= z:
            count += self.tiny
        return count

    def underflows(self, limits, scales) -> np.ndarray:
        """`underflow` at each of the log2 `scales` at once (int64 array): a report asks for a hundred. The same
        rule on arrays (tests hold the two equal)."""
        z, scales = limits.zero_exponent, np.asarray(scales, dtype=np.int64)
        edge = z - scales - E_LO                  # the bin of 2^z after scaling: the bins below it flush
        count = self._cumulative_array[np.clip(edge, 0, N_BINS)]
        if limits.tie_to_zero:
            count = count + np.where((edge >= 0) & (edge < N_BINS), self.pow2[np.clip(edge, 0, N_BINS - 1)], 0)
        return count + np.where(TINY_LOG2_RANGE[0] + scales <= z, self.tiny, 0)

    def subnormal(self, limits, scale: int = 0) -> int:
        """Nonzero values that land below the format's min normal without flushing (2^z < |x|*2^scale < min_normal).

        Those keep fewer significant bits than normal values (or, for a format
        without subnormals, round to 0 or min normal). `tiny` values are counted
        here when none of them underflows and some fall below min normal.
        """
        z, emin = limits.zero_exponent, limits.emin
        count = self._below(emin, scale) - self._below(z, scale)
        if limits.tie_to_zero:
            count -= self._at(self.pow2, z - scale)
        if TINY_LOG2_RANGE[0] + scale > z and TINY_LOG2_RANGE[0] + scale < emin:
            count += self.tiny
        return count

    def overflow_bounds(self, limits, scale: int = 0) -> tuple[int, int]:
        """(sure, possible) counts of values beyond the format's overflow threshold after scaling by 2^scale.

        Binades above emax overflow for sure; the binade emax holds the threshold
        (max + ulp/2), so its values may or may not: `possible` adds them. The
        exact answer to "does anything overflow" comes from the amax (see
        `FormatLimits.overflows`); `huge` values count as overflow.
        """
        emax = limits.emax
        above = emax + 1 - scale - E_LO
        cumulative = self._cumulative
        sure = cumulative[-1] - cumulative[max(0, min(above, N_BINS))] + self.huge
        if TINY_LOG2_RANGE[1] - 1 + scale > emax:
            sure += self.tiny
        return sure, sure + self._at(self.counts, emax - scale)

    # ---------------------------------------------------------------- json
    def to_dict(self) -> dict:
        nonempty = np.flatnonzero(self.counts)
        lo = int(nonempty[0]) if nonempty.size else 0
        hi = int(nonempty[-1]) + 1 if nonempty.size else 0
        return {
            "min_exponent": lo + E_LO,
            "counts": self.counts[lo:hi].tolist(),
            "powers_of_two": self.pow2[lo:hi].tolist(),
            "tiny": self.tiny, "huge": self.huge, "zeros": self.zeros,
            "pos_inf": self.pos_inf, "neg_inf": self.neg_inf, "nan": self.nan,
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Log2Histogram":
        counts = np.zeros(N_BINS, dtype=np.int64)
        pow2 = np.zeros(N_BINS, dtype=np.int64)
        start = data["min_exponent"] - E_LO
        counts[start:start + len(data["counts"])] = data["counts"]
        pow2[start:start + len(data["powers_of_two"])] = data["powers_of_two"]
        return cls(counts, pow2, *(int(data[k]) for k in ("tiny", "huge", "zeros", "pos_inf", "neg_inf", "nan")))
