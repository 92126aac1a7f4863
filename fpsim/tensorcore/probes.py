"""Designed dot-product rows that expose how a tensor core adds.

A tensor core is modelled as a block FMA: a block of F exact products plus
the accumulator c are aligned to the largest exponent among them, bits beyond
a window of (p + extra) bits below that exponent are truncated, the aligned
terms are added exactly, and the sum is normalised and rounded once (toward
zero for fp32 output on NVIDIA parts, nearest-even for fp16). Each probe row
below isolates one parameter of that model (Fasi, Higham, Mikaitis and
Pranesh, "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021; Khattak
and Mikaitis, "Accurate Models of NVIDIA Tensor Cores", HPEC 2025 / ACM TACO,
doi:10.1145/3830409).

Here p is the precision of the accumulator/output format (24 for fp32, 11 for
fp16) and "ulp" is the output format's unit in the last place. Each row's tag
is ``"probe:<family>:<variant...>:<parameter>=<value>"``.

Families (how to read the result):

``exact``
    Small integers and dyadic values whose exact sum any correct hardware
    returns exactly. The capture driver uses them as its self-check: a
    mismatch means a fragment-layout or packing bug, not arithmetic.
``alignment``
    Terms +2^B, -2^B and +2^(B-s) for shifts s (products, or with c as the big
    or as the small term; ``frac`` uses 1.5*2^(B-s)). The big terms cancel, so
    the exact result is the small term. It survives while s is inside the
    alignment window and comes back 0 (or truncated) beyond it: the largest s
    that survives is the window width p + extra. The position patterns
    (first, last, spread, smallfirst) put the terms in the same or different
    blocks of the row, so a window that seems wider for some patterns reveals
    block boundaries.
``blocksize``
    A big term 2^B and n copies of 2^(B-p) (half an ulp of 2^B) or
    2^(B-p-1) (a quarter ulp), n = 1..K, with c = 0 (big first or last) or
    c = 2^B. Inside one block the small terms add up exactly before the single
    rounding, so d grows by one ulp for every 2 (or 4) of them; once they
    fall into another block each block rounds on its own and the growth
    stalls. The n at which the pattern breaks is the block size F.
``rounding``
    Exact sums M + j/8 ulp (j = 1..7) above an even M (``even``), above an odd
    M (``odd``) and M - j/8 ulp below an even M (``below``), both signs. All
    terms lie within p bits of the largest one, so no alignment loss occurs
    and only the final rounding acts: RZ gives M for every j above, RN-even
    rounds j > 4 away and j = 4 to even, RU/RD depend on sign.
``carry``
    n products of (2 - 2^(1-q))^2 (q: input precision), all of one sign, with
    c = 0, a large c of the same sign (the largest c-format significand at the
    sum's magnitude) or a small one. The sum's exponent grows by up to
    log2(n) + 1 bits; how many carry bits the adder keeps shows in the low bits.
``subnormal``
    Subnormal inputs (the format's smallest and largest subnormal times 1, times
    a power of two, times each other), fp32-subnormal results (bf16/tf32 products
    and cancellations, or a subnormal c), and fp16-subnormal results for fp16
    output. A zero where the exact value is a subnormal means flushing.
``monotonicity``
    Pairs of rows (``lo``/``hi``) identical but for one big term increased so
    that the largest exponent grows by one ((2-ulp)*2^B -> 2^(B+1), or
    1.875*2^B -> 2^(B+1)), next to small terms near the window's edge. With a
    fixed window, hi's small terms lose one more bit, so d(hi) can be smaller
    than d(lo) although every term is larger or equal: non-monotonic sums.
``special``
    Signed zeros (products +0/-0 with c = +0/-0), exact cancellation x - x,
    Inf and NaN inputs where the input format has them (E4M3 has NaN but no
    Inf), Inf/NaN c, and overflow of the output format (e.g. fp32 max plus
    half an ulp: RN-even overflows to Inf, RZ stays at max).
``random``
    Not probes: the captures' random rows (`samples.random_rows`), in the same
    ProbeSet form, tagged ``random:wide`` and ``random:upstream``.

All a and b values are exactly representable in the input format and every c
in ``c_format``. Every product is exactly representable in binary32 except in
the probes that test product underflow or overflow themselves (bf16/tf32
``subnormal:input:min*min`` and ``max*max``, ``subnormal:output`` products
below binary32's smallest subnormal grid, ``special:overflow``); their float64
values are still exact. Probe sets are deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..formats import PRESETS, Format, format as get_format
from . import devices
from .captures import is_representable

_FP32 = PRESETS["fp32"]  # products and sums are held in binary32

FAMILIES = {
    "exact": "small integers/dyadics with exactly representable sums: the driver's self-check",
    "alignment": "+2^B, -2^B, +2^(B-s): largest surviving shift s = alignment window width",
    "blocksize": "2^B then n copies of 2^(B-p) or 2^(B-p-1): where growth stalls = block size F",
    "rounding": "sums at j/8 ulp above/below M, both signs: the final rounding mode and ties",
    "carry": "n products of (2-ulp)^2 of one sign, c = 0 or large: carry/normalisation bits",
    "subnormal": "subnormal inputs, fp32- and fp16-subnormal results: flushing or gradual underflow",
    "monotonicity": "lo/hi pairs where one term grows to the next binade: non-monotonic sums",
    "special": "signed zeros, cancellation, Inf/NaN inputs and c, output overflow",
    "random": "random rows: 'wide' exponent spread and 'upstream'-like N(0,1) inputs",
}


@dataclass(frozen=True)
class ProbeSet:
    """Rows of a dot-product experiment: d[r] = sum_k a[r,k]*b[r,k] + c[r].

    ``a``, ``b`` (R, K) and ``c`` (R,) are float64 values; ``tags`` (R,) names
    each row's family and parameter.
    """

    inputs: str
    k: int
    c_format: str
    tags: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray

    def __len__(self) -> int:
        return int(self.tags.shape[0])

    def select(self, mask) -> "ProbeSet":
        """The rows where ``mask`` is true."""
        mask = np.asarray(mask)
        return ProbeSet(self.inputs, self.k, self.c_format, self.tags[mask],
                        self.a[mask], self.b[mask], self.c[mask])

    def family_mask(self, family: str) -> np.ndarray:
        """Boolean mask of the rows of one family."""
        return np.array([t.startswith(f"probe:{family}:") or t.startswith(f"{family}:")
                         for t in self.tags], dtype=bool)

    def exact_sum(self) -> np.ndarray:
        """sum a*b + c per row in float64 (exact when the terms fit 53 bits, as
        for the ``exact`` family; a reference only otherwise)."""
        with np.errstate(invalid="ignore", over="ignore"):
            return (self.a * self.b).sum(axis=1) + self.c

    def check(self) -> None:
        """Raise ValueError unless every a/b is representable in the input format
        and every c in the c format."""
        for name, arr, fmt in (("a", self.a, self.inputs), ("b", self.b, self.inputs),
                               ("c", self.c, self.c_format)):
            ok = is_representable(arr, fmt)
            if not ok.all():
                r = int(np.argwhere(~ok)[0][0])
                raise ValueError(f"{name} in row {r} ({self.tags[r]}) is not representable "
                                 f"in {fmt}: {arr[~ok].flat[0]!r}")


def concat(*sets: ProbeSet) -> ProbeSet:
    """Rows of several probe sets of the same inputs, K and c format, in order."""
    first = sets[0]
    for s in sets[1:]:
        if (s.inputs, s.k, s.c_format) != (first.inputs, first.k, first.c_format):
            raise ValueError("cannot concatenate probe sets of different inputs, K or c format")
    return ProbeSet(first.inputs, first.k, first.c_format,
                    np.concatenate([s.tags for s in sets]),
                    np.concatenate([s.a for s in sets]),
                    np.concatenate([s.b for s in sets]),
                    np.concatenate([s.c for s in sets]))


# ---------------------------------------------------------------------------
# Building rows
# ---------------------------------------------------------------------------

def check_args(inputs: str, k: int, c_format: str) -> None:
    """Refuse an input format, row length or c format the rows cannot be built for."""
    if inputs not in devices.INPUT_FORMATS or devices.is_block(inputs):
        allowed = [name for name in devices.INPUT_FORMATS if not devices.is_block(name)]
        raise ValueError(f"unknown input format {inputs!r}; allowed: {allowed} (block formats are not probed: "
                         f"their MMAs take block scales, which the rows do not set)")
    if c_format not in devices.OUTPUT_FORMATS:
        raise ValueError(f"unknown c format {c_format!r}; allowed: {list(devices.OUTPUT_FORMATS)}")
    if not isinstance(k, (int, np.integer)) or k < 4:
        raise ValueError(f"k must be an integer >= 4, got {k!r}")


class _Rows:
    """Accumulates rows; every term is placed as (position, a, b)."""

    def __init__(self, inputs: str, k: int, c_format: str):
        self.inputs, self.k, self.c_format = inputs, k, c_format
        self.spec, self.cspec = get_format(inputs), get_format(c_format)
        self.tags, self.a, self.b, self.c = [], [], [], []

    def add(self, tag: str, terms, c: float = 0.0) -> None:
        a, b = np.zeros(self.k), np.zeros(self.k)
        for pos, x, y in terms:
            a[pos], b[pos] = x, y
        self.tags.append(tag)
        self.a.append(a)
        self.b.append(b)
        self.c.append(c)

    def factor(self, value: float, allow_subnormal: bool = False):
        """(a, b) with a*b == value, both representable inputs, or None.

        b is a power of two; a carries the significand. The exponents are split
        as evenly as the format allows.
        """
        if value == 0:
            return (math.copysign(0.0, value), 0.0)
        spec = self.spec
        m, e = math.frexp(abs(value))
        m, e = m * 2, e - 1                  # value = m * 2^e, m in [1, 2)
        lo = spec.emin - (spec.man_bits if allow_subnormal else 0)
        mid = (e + 1) // 2
        for delta in range(0, 2 * (spec.emax - lo) + 2):
            ea = mid + (delta + 1) // 2 * (1 if delta % 2 else -1)
            eb = e - ea
            if lo <= eb <= spec.emax and self._fits(m, ea, lo) and self._fits(1.0, eb, lo):
                return (math.copysign(m * 2.0**ea, value), 2.0**eb)
        return None

    def _fits(self, m: float, e: int, lo: int) -> bool:
        """Is m * 2^e (m in [1, 2)) a value of the input format, with e >= lo?"""
        spec = self.spec
        if e < lo or e > spec.emax or m * 2.0**e > float(spec.max):
            return False
        frac_bits = spec.man_bits - max(0, spec.emin - e)   # fewer bits when subnormal
        scaled = m * 2.0**frac_bits
        return frac_bits >= 0 and scaled == int(scaled)

    def _ok(self, x: float) -> bool:
        return bool(is_representable(np.array([x]), self.inputs)[0])

    def c_ok(self, x: float) -> bool:
        return bool(is_representable(np.array([x]), self.c_format)[0])

    def products(self, positions, values, allow_subnormal=False):
        """Terms for the given product values, or None if one cannot be built."""
        terms = []
        for pos, v in zip(positions, values):
            f = self.factor(v, allow_subnormal)
            if f is None:
                return None
            terms.append((pos, f[0], f[1]))
        return terms

    def done(self) -> ProbeSet:
        k = self.k
        ps = ProbeSet(self.inputs, k, self.c_format, np.array(self.tags, dtype=str),
                      np.array(self.a, dtype=np.float64).reshape(-1, k),
                      np.array(self.b, dtype=np.float64).reshape(-1, k),
                      np.array(self.c, dtype=np.float64))
        ps.check()
        return ps


def _out_precision(c_format: str) -> int:
    return get_format(c_format).precision


def _product_range(inputs: str) -> tuple:
    """Exponents of powers of two that are products of two normal inputs and
    normal binary32 numbers."""
    spec = get_format(inputs)
    return max(2 * spec.emin, _FP32.emin), min(2 * spec.emax, _FP32.emax)


def _subnormal_range(fmt: Format) -> tuple[float, float]:
    """(smallest, largest) positive subnormal of a format."""
    return float(fmt.min_subnormal), float(fmt.min_normal - fmt.min_subnormal)


def _patterns(k: int) -> dict:
    """Positions (big+, big-, small) of the alignment terms in the row."""
    return {"first": (0, 1, 2), "last": (k - 1, k - 2, k - 3),
            "spread": (0, k - 1, k // 2), "smallfirst": (k - 1, k // 2, 0)}


# ---------------------------------------------------------------------------
# The families
# ---------------------------------------------------------------------------

def _exact(r: _Rows, n: int = 64) -> None:
    """Small integers and halves: sums exact in every format and at any width."""
    rng = np.random.default_rng(20240601)
    values = np.array([-3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3])
    for i in range(n):
        a = rng.choice(values, r.k)
        b = rng.choice(values, r.k)
        c = float(rng.integers(-16, 17)) / (2 if i % 2 else 1)
        r.add(f"probe:exact:row={i}", [(j, a[j], b[j]) for j in range(r.k)], c)


def _alignment(r: _Rows) -> None:
    p = _out_precision(r.c_format)
    pmin, pmax = _product_range(r.inputs)
    out = r.cspec
    hi = min(pmax, out.emax - 1)            # big terms: products and c-format values
    for s in range(p - 4, p + 17):
        for pattern, (i_plus, i_minus, i_small) in _patterns(r.k).items():
            for variant in ("pp", "frac", "cbig", "csmall"):
                # the small term (the exact result) must be a normal output value,
                # and a normal product unless it is c
                lo = s + (out.emin if variant == "csmall" else max(pmin, out.emin))
                if lo > hi:
                    continue
                B = min(hi, max(lo, 20))
                big = 2.0**B
                small = (1.5 if variant == "frac" else 1.0) * 2.0 ** (B - s)
                if variant in ("pp", "frac"):
                    terms, c = r.products((i_plus, i_minus, i_small), (big, -big, small)), 0.0
                elif variant == "cbig":
                    terms, c = r.products((i_minus, i_small), (-big, small)), big
                else:
                    terms, c = r.products((i_plus, i_minus), (big, -big)), small
                if terms is not None and r.c_ok(c):
                    r.add(f"probe:alignment:{variant}:{pattern}:shift={s}", terms, c)


def _blocksize(r: _Rows) -> None:
    p = _out_precision(r.c_format)
    pmin, pmax = _product_range(r.inputs)
    hi = min(pmax, r.cspec.emax - 1)
    for drop, label in ((p, "half"), (p + 1, "quarter")):
        B = min(hi, max(pmin + drop, min(4, hi)))
        big, small = 2.0**B, 2.0 ** (B - drop)
        for n in range(1, r.k + 1):
            if n < r.k:
                t = r.products([0] + list(range(1, n + 1)), [big] + [small] * n)
                if t is not None:
                    r.add(f"probe:blocksize:bigfirst:{label}:n={n}", t)
                t = r.products([r.k - 1] + list(range(n)), [big] + [small] * n)
                if t is not None:
                    r.add(f"probe:blocksize:biglast:{label}:n={n}", t)
            t = r.products(list(range(n)), [small] * n)
            if t is not None and r.c_ok(big):
                r.add(f"probe:blocksize:cbig:{label}:n={n}", t, big)


def _rounding(r: _Rows) -> None:
    """S = 2^E + t * 2^(E-p-2): four products 1.75*2^(E-3) plus
    c = 2^(E-3) * (1 + t*2^(1-p)); t encodes j/8 ulp above/below M."""
    p = _out_precision(r.c_format)
    E = 3
    patterns = {"first": (0, 1, 2, 3)}
    if r.k >= 8:
        patterns["spread"] = (0, r.k // 3, (2 * r.k) // 3, r.k - 1)
    for base, offset, sign_of_j in (("even", 0, 1), ("odd", 8, 1), ("below", 32, -1)):
        for j in range(1, 8):
            t = offset + sign_of_j * j
            for sign in (1.0, -1.0):
                for pname, pos in patterns.items():
                    terms = r.products(pos, [sign * 1.75 * 2.0 ** (E - 3)] * 4)
                    c = sign * 2.0 ** (E - 3) * (1 + t * 2.0 ** (1 - p))
                    if terms is None or not r.c_ok(c):
                        continue
                    s = "+" if sign > 0 else "-"
                    r.add(f"probe:rounding:{base}:{s}:{pname}:eighths={j}", terms, c)


def _carry(r: _Rows) -> None:
    q = r.spec.precision
    p = _out_precision(r.c_format)
    big_sig = 2 - 2.0 ** (1 - q)
    ns = sorted({1, 2, 3, r.k // 4, r.k // 2, r.k - 1, r.k})
    for n in ns:
        growth = math.ceil(math.log2(n)) + 2           # sum < 4n <= 2^growth
        for sign in (1.0, -1.0):
            terms = [(i, sign * big_sig, big_sig) for i in range(n)]
            cs = {"zero": 0.0,
                  "large": sign * (2 - 2.0 ** (1 - p)) * 2.0 ** (growth - 1),
                  "small": sign * 2.0 ** (-p + 3)}
            for cname, c in cs.items():
                if r.c_ok(c):
                    s = "+" if sign > 0 else "-"
                    r.add(f"probe:carry:{s}:c={cname}:n={n}", terms, c)


def _subnormal(r: _Rows) -> None:
    spec, k = r.spec, r.k
    smin, smax = _subnormal_range(spec)
    pairs = {"min*1": (smin, 1.0), "max*1": (smax, 1.0), "-min*1": (-smin, 1.0),
             "min*min": (smin, smin), "max*max": (smax, smax),
             "min*2^emax": (smin, 2.0**spec.emax), "max*2": (smax, 2.0)}
    for name, (x, y) in pairs.items():
        for where, pos in (("first", 0), ("last", k - 1)):
            r.add(f"probe:subnormal:input:{name}:{where}", [(pos, x, y)])
    r.add("probe:subnormal:input:sum_of_min", [(i, smin, 1.0) for i in range(k)])
    r.add("probe:subnormal:input:min*1+c=1", [(0, smin, 1.0)], 1.0)

    out = r.cspec
    out_min, out_max = _subnormal_range(out)
    # subnormal c with zero products
    for name, c in (("c=min", out_min), ("c=-min", -out_min),
                    ("c=max", out_max), ("c=min_normal", float(out.min_normal))):
        r.add(f"probe:subnormal:output:{name}", [], c)
    # results in the output format's subnormal range, built from products
    e0 = out.emin
    targets = {"2^(emin-4)": 2.0 ** (e0 - 4), "1.5*2^(emin-8)": 1.5 * 2.0 ** (e0 - 8),
               "min_sub": out_min, "1.5*min_sub": 1.5 * out_min,
               "0.5*min_sub": 0.5 * out_min, "0.75*min_sub": 0.75 * out_min}
    for name, v in targets.items():
        t = r.products([0], [v], allow_subnormal=True)
        if t is not None:
            r.add(f"probe:subnormal:output:product={name}", t)
    # cancellation into the subnormal range: 2^emin - 2^(emin-1)
    t = r.products([0, 1], [2.0**e0, -(2.0 ** (e0 - 1))], allow_subnormal=True)
    if t is not None:
        r.add("probe:subnormal:output:cancel", t)


def _monotonicity(r: _Rows) -> None:
    p = _out_precision(r.c_format)
    q = r.spec.precision
    pmin, pmax = _product_range(r.inputs)
    B = min(pmax - 1, r.cspec.emax - 2, max(4, pmin + p + 4))
    for bname in ("maxsig", "1.875"):
        for drop in range(4):
            small = 1.5 * 2.0 ** (B - p + 1 - drop)     # straddles the window's edge
            for n in sorted({1, 2, min(3, r.k - 1)}):
                rest = r.products(range(1, n + 1), [small] * n)
                for which in ("lo", "hi"):
                    big = _monotonic_big(r, bname, which, B, q)
                    if big is not None and rest is not None:
                        r.add(f"probe:monotonicity:{bname}:drop={drop}:n={n}:{which}", big + rest)
        # the same with the big term in c (c has p bits: its largest significand)
    lo_c, hi_c = (2 - 2.0 ** (1 - p)) * 2.0**B, 2.0 ** (B + 1)
    for drop in range(4):
        small = 1.5 * 2.0 ** (B - p + 1 - drop)
        rest = r.products(range(2), [small, small])
        if rest is not None and r.c_ok(lo_c) and r.c_ok(hi_c):
            r.add(f"probe:monotonicity:cbig:drop={drop}:n=2:lo", rest, lo_c)
            r.add(f"probe:monotonicity:cbig:drop={drop}:n=2:hi", rest, hi_c)


def _monotonic_big(r: _Rows, bname: str, which: str, B: int, q: int):
    """The big term of a monotonicity pair at position 0, or None."""
    if which == "hi":
        return r.products([0], [2.0 ** (B + 1)])
    if bname == "maxsig":
        return r.products([0], [(2 - 2.0 ** (1 - q)) * 2.0**B])
    f = r.factor(1.25 * 2.0**B)                 # 1.875 = 1.25 * 1.5
    if f is None or not r._ok(f[1] * 1.5):
        return None
    return [(0, f[0], f[1] * 1.5)]


def _special(r: _Rows) -> None:
    k, spec, out = r.k, r.spec, r.cspec
    inf, nan = math.inf, math.nan
    # signed zeros
    def sign(z):
        return "-" if math.copysign(1, z) < 0 else "+"

    for pa in (0.0, -0.0):
        for cz in (0.0, -0.0):
            r.add(f"probe:special:zero:products={sign(pa)}0:c={sign(cz)}0",
                  [(i, pa, 1.0) for i in range(k)], cz)
    r.add("probe:special:zero:empty:c=-0", [], -0.0)
    # exact cancellation
    for cz in (0.0, -0.0):
        r.add(f"probe:special:cancel:x-x:c={sign(cz)}0", [(0, 1.5, 1.0), (1, -1.5, 1.0)], cz)
        r.add(f"probe:special:cancel:-x+x:c={sign(cz)}0", [(0, -1.5, 1.0), (1, 1.5, 1.0)], cz)
    r.add("probe:special:cancel:x+c=-x", [(0, 1.5, 1.0)], -1.5)
    r.add("probe:special:cancel:-x+c=x", [(0, -1.5, 1.0)], 1.5)
    # Inf and NaN inputs
    if spec.infinities:
        r.add("probe:special:inf:a=inf", [(0, inf, 1.0)])
        r.add("probe:special:inf:a=-inf", [(0, -inf, 1.0)])
        r.add("probe:special:inf:inf*0", [(0, inf, 0.0)])
        r.add("probe:special:inf:inf-inf", [(0, inf, 1.0), (1, -inf, 1.0)])
        r.add("probe:special:inf:inf+c=-inf", [(0, inf, 1.0)], -inf)
    r.add("probe:special:nan:a=nan", [(0, nan, 1.0)])
    r.add("probe:special:nan:b=nan,last", [(k - 1, 1.0, nan)])
    r.add("probe:special:nan:c=nan", [(0, 1.0, 1.0)], nan)
    r.add("probe:special:inf:c=inf", [(0, 1.0, 1.0)], inf)
    r.add("probe:special:inf:c=-inf", [(0, 1.0, 1.0)], -inf)
    # overflow of the output format
    omax = float(out.max)
    half_ulp = 2.0 ** (out.emax - out.man_bits - 1)
    for name, v in (("c=max+halfulp", half_ulp), ("c=max+ulp", 2 * half_ulp),
                    ("c=max+quarterulp", half_ulp / 2), ("c=max+1", 1.0)):
        t = r.products([0], [v])
        if t is not None:
            r.add(f"probe:special:overflow:{name}", t, omax)
            r.add(f"probe:special:overflow:-{name}", [(0, -t[0][1], t[0][2])], -omax)
    # products whose sum overflows the output (each product finite in binary32)
    pmax = min(2 * spec.emax, _FP32.emax)
    big = 2.0**pmax
    if big * 2 > omax:
        t = r.products([0, 1], [big, big])
        if t is not None:
            r.add("probe:special:overflow:two_products", t)
        t = r.products([0], [big])
        if t is not None and big > omax:
            r.add("probe:special:overflow:one_product", t)


def probe_rows(inputs: str, k: int, c_format: str = "fp32") -> ProbeSet:
    """All probe families for one input format, row length k and c format.

    ``c_format`` is the accumulator's format (the output format of the MMA):
    "fp32" or "fp16". Deterministic: the same arguments give the same rows.
    """
    check_args(inputs, k, c_format)
    r = _Rows(inputs, int(k), c_format)
    for family in (_exact, _alignment, _blocksize, _rounding, _carry, _subnormal,
                   _monotonicity, _special):
        family(r)
    return r.done()
