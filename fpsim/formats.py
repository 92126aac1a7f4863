"""Floating-point formats: the `Format` description and the named presets.

This is the ground floor of fpsim: it imports nothing else of the package.
A format is a binary layout (sign bit, `exp_bits`, `man_bits`, `bias`) plus
the rules for its special codes (infinities, NaN encoding, subnormals, zero).
Every derived property (max, min normal, ...) is computed exactly here, as
Python numbers, so that the rounding engine, the codec and the exact oracle
all stand on the same definitions.
"""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

NAN_ENCODINGS = ("ieee", "fn", "fnuz", "none")
"""How a format spells NaN.

- ``ieee``: the all-ones exponent field is reserved: mantissa 0 is ±Inf, any
  other mantissa is NaN (FP16, BF16, FP32, E5M2).
- ``fn``: one NaN per sign, the all-ones code; the rest of the top binade is
  finite and there is no Inf (OCP E4M3FN, E8M0).
- ``fnuz``: the code of negative zero is the only NaN; no -0, no Inf.
- ``none``: every code is a finite number (MX FP6 and FP4).
"""


@dataclasses.dataclass(frozen=True)
class Format:
    """A binary floating-point format.

    Values are ``(-1)^s * 2^(e - bias) * 1.m`` for exponent fields e >= 1 (and
    e = 0 as well when the format has neither subnormals nor zero, as E8M0),
    and ``(-1)^s * 2^(1 - bias) * 0.m`` for e = 0 when it has subnormals.
    """

    exp_bits: int
    man_bits: int
    bias: int | None = None
    signed: bool = True
    infinities: bool | None = None
    nan: str = "ieee"
    subnormals: bool = True
    zero: bool = True
    name: str | None = None

    def __post_init__(self) -> None:
        self._check_types()  # before anything computes with the fields
        if self.nan not in NAN_ENCODINGS:
            raise ValueError(f"unknown NaN encoding {self.nan!r}; allowed: {', '.join(NAN_ENCODINGS)}")
        if self.bias is None:
            object.__setattr__(self, "bias", (1 << (self.exp_bits - 1)) - 1 if self.exp_bits > 0 else 0)
        if self.infinities is None:
            object.__setattr__(self, "infinities", self.nan == "ieee")
        if self.name is None:
            object.__setattr__(self, "name", self._default_name())
        self._validate()

    # ---------------------------------------------------------------- checks
    def _check_types(self) -> None:
        for field in ("exp_bits", "man_bits", "bias"):
            value = getattr(self, field)
            if field == "bias" and value is None:
                continue  # the default bias follows from exp_bits
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Format.{field} must be an int, got {type(value).__name__} {value!r}")
        for field in ("signed", "infinities", "subnormals", "zero"):
            value = getattr(self, field)
            if field == "infinities" and value is None:
                continue  # the default follows from the NaN encoding
            if not isinstance(value, bool):
                raise TypeError(f"Format.{field} must be a bool, got {type(value).__name__} {value!r}")
        if not isinstance(self.nan, str):
            raise TypeError(f"Format.nan must be one of {', '.join(NAN_ENCODINGS)}, got {self.nan!r}")
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"Format.name must be a str or None, got {type(self.name).__name__} {self.name!r}")

    def _validate(self) -> None:
        def fail(why: str) -> None:
            raise ValueError(f"impossible format {self._describe()}: {why}")

        if not 1 <= self.exp_bits <= 11:
            fail(f"exp_bits={self.exp_bits} is outside 1..11 (values must fit binary64)")
        if not 0 <= self.man_bits <= 52:
            fail(f"man_bits={self.man_bits} is outside 0..52 (values must fit binary64)")
        if self.infinities and self.nan != "ieee":
            fail("infinities need the IEEE encoding (all-ones exponent, mantissa 0)")
        if self.nan == "ieee" and not self.infinities:
            fail("the IEEE NaN encoding reserves the all-ones exponent for Inf and NaN; "
                 "use nan='fn' for a format without infinities")
        if self.nan == "ieee" and self.exp_bits < 2:
            fail("the IEEE encoding needs at least 2 exponent bits (one binade would be all special)")
        if self.nan == "ieee" and self.man_bits == 0:
            fail("the IEEE encoding needs a mantissa bit to tell NaN from Inf")
        if self.nan == "fnuz" and not self.signed:
            fail("the fnuz NaN is the negative-zero code, which an unsigned format lacks")
        if self.nan == "fnuz" and not self.zero:
            fail("the fnuz NaN is the negative-zero code, which needs a zero")
        if self.subnormals and not self.zero:
            fail("a format with subnormals has a zero (exponent and mantissa fields 0)")
        if self.subnormals and self.man_bits == 0:
            fail("subnormals need at least one mantissa bit")
        if self.emax < self.emin:
            fail("it has no finite nonzero value")
        # every value must be exact in binary64: the top below its max, the finest spacing on its grid
        if self.max > _FP64_MAX:
            fail(f"its largest value is about 2^{self.emax + 1}, beyond binary64's 2^1024")
        if self.emin - self.man_bits < -1074:
            fail(f"its values are spaced down to 2^{self.emin - self.man_bits}, finer than binary64's 2^-1074")

    def _describe(self) -> str:
        return (f"Format(exp_bits={self.exp_bits}, man_bits={self.man_bits}, bias={self.bias}, "
                f"signed={self.signed}, infinities={self.infinities}, nan={self.nan!r}, "
                f"subnormals={self.subnormals}, zero={self.zero})")

    def _default_name(self) -> str:
        tail = {"ieee": "", "fn": "fn", "fnuz": "fnuz", "none": "nonan"}[self.nan]
        unsigned = "" if self.signed else "u"
        extras = ("" if self.subnormals else "_nosub") + ("" if self.zero else "_nozero")
        return f"e{self.exp_bits}m{self.man_bits}{tail}{unsigned}_b{self.bias}{extras}"

    # ------------------------------------------------------------ structure
    @property
    def bits(self) -> int:
        """Total width of a code."""
        return int(self.signed) + self.exp_bits + self.man_bits

    @property
    def precision(self) -> int:
        """Significand bits, the implicit one included."""
        return self.man_bits + 1

    @functools.cached_property
    def max_exp_field(self) -> int:
        """Largest exponent field that encodes finite values."""
        top = (1 << self.exp_bits) - 1
        if self.nan == "ieee":
            return top - 1
        if self.nan == "fn" and self.man_bits == 0:
            return top - 1  # the all-ones code is the exponent field's only code
        return top

    @functools.cached_property
    def min_exp_field(self) -> int:
        """Smallest exponent field that encodes normal values."""
        return 1 if self.zero else 0

    @functools.cached_property
    def emax(self) -> int:
        """Unbiased exponent of the largest binade."""
        return self.max_exp_field - self.bias

    @functools.cached_property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return self.min_exp_field - self.bias

    @functools.cached_property
    def max_significand(self) -> int:
        """Largest integral significand (with implicit bit) in the top binade."""
        full = (1 << (self.man_bits + 1)) - 1
        if self.nan == "fn" and self.man_bits > 0:
            return full - 1  # the all-ones mantissa of the top binade is NaN
        return full

    # ---------------------------------------------------------------- values
    @functools.cached_property  # derived once: the format is frozen
    def max(self) -> Fraction:
        """Largest finite value."""
        return Fraction(self.max_significand) * _pow2(self.emax - self.man_bits)

    @functools.cached_property
    def min_normal(self) -> Fraction:
        """Smallest positive normal value."""
        return _pow2(self.emin)

    @functools.cached_property
    def min_subnormal(self) -> Fraction:
        """Smallest positive value (the min normal when there are no subnormals)."""
        return _pow2(self.min_exponent)

    @property
    def min_exponent(self) -> int:
        """log2 of the smallest positive value: the finest spacing's exponent with subnormals, else emin."""
        return self.emin - self.man_bits if self.subnormals else self.emin

    @functools.cached_property
    def eps(self) -> Fraction:
        """Machine epsilon: the gap between 1 and the next larger value."""
        return _pow2(-self.man_bits)

    @property
    def normal_binades(self) -> int:
        """Number of binades [2^e, 2^(e+1)) holding normal values."""
        return self.emax - self.emin + 1

    @property
    def subnormal_binades(self) -> int:
        """Number of binades holding subnormal values."""
        return self.man_bits if self.subnormals else 0

    @property
    def binades(self) -> int:
        """All binades holding a nonzero finite value: normal plus subnormal binades."""
        return self.normal_binades + self.subnormal_binades

    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @property
    def has_negative_zero(self) -> bool:
        return self.signed and self.zero and self.nan != "fnuz"

    # ------------------------------------------------------------- relations
    def contains(self, other: "Format") -> bool:
        """True when every finite value of `other` (signed zeros included) is a value of this format."""
        return _contains(self, other)

    def _contains(self, other: "Format") -> bool:
        if other.max > self.max or other.min_subnormal < self.min_subnormal:
            return False
        if (other.signed and not self.signed) or (other.zero and not self.zero):
            return False
        if other.has_negative_zero and not self.has_negative_zero:
            return False
        # At every magnitude 2^e that `other` covers, its spacing must be a
        # multiple of ours.
        return all(
            max(e, other.emin) - other.man_bits >= max(e, self.emin) - self.man_bits
            for e in range(other.min_exponent, other.emax + 1)
        )

    # ------------------------------------------------------------- bindings
    @property
    def ml_dtype(self):
        """The numpy/ml_dtypes scalar type with exactly this encoding, or None."""
        return _native_dtype(self, "numpy")

    @property
    def torch_dtype(self):
        """The torch dtype with exactly this encoding, or None."""
        return _native_dtype(self, "torch")

    def __str__(self) -> str:
        return self.name


@functools.lru_cache(maxsize=1024)
def _contains(outer: Format, inner: Format) -> bool:
    return outer._contains(inner)


_FP64_MAX = Fraction(2**1024 - 2**971)


def _pow2(e: int) -> Fraction:
    return Fraction(2) ** e


def _layout(fmt: Format) -> tuple:
    return (fmt.exp_bits, fmt.man_bits, fmt.bias, fmt.signed, fmt.infinities,
            fmt.nan, fmt.subnormals, fmt.zero)


# --------------------------------------------------------------------- presets
PRESETS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(11, 52, name="fp64"),
        Format(8, 23, name="fp32"),
        Format(8, 10, name="tf32"),
        Format(5, 10, name="fp16"),
        Format(8, 7, name="bf16"),
        Format(4, 3, nan="fn", name="e4m3"),
        Format(5, 2, name="e5m2"),
        Format(4, 3, bias=8, nan="fnuz", name="e4m3fnuz"),
        Format(5, 2, bias=16, nan="fnuz", name="e5m2fnuz"),
        Format(3, 2, nan="none", name="e3m2"),
        Format(2, 3, nan="none", name="e2m3"),
        Format(2, 1, nan="none", name="e2m1"),
        Format(8, 0, bias=127, signed=False, nan="fn", subnormals=False, zero=False, name="e8m0"),
        # the other ml_dtypes float types
        Format(3, 4, name="e3m4"),                                 # float8_e3m4: IEEE-like, bias 3
        Format(4, 3, name="e4m3ieee"),                             # float8_e4m3: IEEE-like, Inf, max 240
        Format(4, 3, bias=11, nan="fnuz", name="e4m3b11fnuz"),     # float8_e4m3b11fnuz (TPU)
        Format(5, 3, signed=False, nan="fn", name="e5m3fnu"),      # float8_e5m3fnu: unsigned
    )
}

ALIASES: dict[str, str] = {
    "float64": "fp64", "double": "fp64", "binary64": "fp64",
    "float32": "fp32", "float": "fp32", "single": "fp32", "binary32": "fp32",
    "tensorfloat32": "tf32",
    "float16": "fp16", "half": "fp16", "binary16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "e4m3", "e4m3fn": "e4m3", "fp8_e4m3": "e4m3", "fp8e4m3": "e4m3",
    "float8_e5m2": "e5m2", "fp8_e5m2": "e5m2", "fp8e5m2": "e5m2",
    "float8_e4m3fnuz": "e4m3fnuz", "float8_e5m2fnuz": "e5m2fnuz",
    "float6_e3m2fn": "e3m2", "e3m2fn": "e3m2", "fp6_e3m2": "e3m2",
    "float6_e2m3fn": "e2m3", "e2m3fn": "e2m3", "fp6_e2m3": "e2m3",
    "float4_e2m1fn": "e2m1", "e2m1fn": "e2m1", "fp4_e2m1": "e2m1", "fp4": "e2m1",
    "float8_e8m0fnu": "e8m0", "e8m0fnu": "e8m0",
    "float8_e3m4": "e3m4", "float8_e4m3": "e4m3ieee", "float8_e4m3b11fnuz": "e4m3b11fnuz",
    "float8_e5m3fnu": "e5m3fnu",
    "float4_e2m1fn_x2": "e2m1",  # torch's packed FP4: two E2M1 codes per byte
}


def format(name) -> Format:  # noqa: A001 - the public API name
    """Look up a format by preset name or alias (case-insensitive), or by a numpy, ml_dtypes or
    torch float dtype (``np.float16``, ``np.dtype(">f4")``, ``ml_dtypes.float8_e4m3fn``,
    ``torch.bfloat16``); a Format passes through."""
    if isinstance(name, Format):
        return name
    if not isinstance(name, str):
        text = _dtype_name(name)
        if text is None:
            raise TypeError(f"a format is a name, a float dtype or a fpsim.Format, got {type(name).__name__} "
                            f"{name!r}")
        return format(text)
    key = name.strip().lower().replace("-", "_")
    key = key.removeprefix("torch.").removeprefix("ml_dtypes.").removeprefix("np.").removeprefix("numpy.")
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return PRESETS[key]
    raise ValueError(f"unknown format {name!r}; allowed: {', '.join(PRESETS)} "
                     f"(aliases: {', '.join(sorted(ALIASES))})")


def _dtype_name(dtype) -> str | None:
    """The name of a torch dtype or of a numpy/ml_dtypes float dtype or scalar type, else None.

    Neither library is imported here: a torch dtype is recognised by its type, and numpy is
    asked only about objects that are numpy dtypes or numpy scalar types already."""
    kind = type(dtype)
    if kind.__module__ == "torch" and kind.__name__ == "dtype":
        name = str(dtype).removeprefix("torch.")
        if name in ("float32", "float64", "float16", "bfloat16") or name.startswith(("float8", "float4")):
            return name
        raise TypeError(f"{dtype} is not a floating-point format")
    import numpy

    if dtype is float:
        return "float64"
    if isinstance(dtype, numpy.dtype) or (isinstance(dtype, type) and issubclass(dtype, numpy.generic)):
        resolved = numpy.dtype(dtype)
        if resolved.kind == "f" or resolved.name.startswith(("bfloat16", "float8", "float6", "float4")):
            return resolved.name
        raise TypeError(f"{resolved.name} is not a floating-point format")
    return None


# -------------------------------------------------------------- native dtypes
_NATIVE_NAMES = {
    "fp64": ("float64", "float64"), "fp32": ("float32", "float32"),
    "fp16": ("float16", "float16"), "bf16": ("bfloat16", "bfloat16"),
    "e4m3": ("float8_e4m3fn", "float8_e4m3fn"), "e5m2": ("float8_e5m2", "float8_e5m2"),
    "e4m3fnuz": ("float8_e4m3fnuz", "float8_e4m3fnuz"),
    "e5m2fnuz": ("float8_e5m2fnuz", "float8_e5m2fnuz"),
    "e3m2": ("float6_e3m2fn", None), "e2m3": ("float6_e2m3fn", None),
    "e2m1": ("float4_e2m1fn", None), "e8m0": ("float8_e8m0fnu", "float8_e8m0fnu"),
    "e3m4": ("float8_e3m4", None), "e4m3ieee": ("float8_e4m3", None),
    "e4m3b11fnuz": ("float8_e4m3b11fnuz", None), "e5m3fnu": ("float8_e5m3fnu", None),
}


@functools.lru_cache(maxsize=256)  # (every quantize call asks: a scan of the presets each time cost ~10 us)
def _native_dtype(fmt: Format, library: str):
    for preset_name, names in _NATIVE_NAMES.items():
        if _layout(PRESETS[preset_name]) != _layout(fmt):
            continue
        attr = names[0] if library == "numpy" else names[1]
        if attr is None:
            return None
        try:
            if library == "torch":
                import torch
                return getattr(torch, attr, None)
            import numpy
            if hasattr(numpy, attr) and attr in ("float64", "float32", "float16"):
                return getattr(numpy, attr)
            import ml_dtypes
            return getattr(ml_dtypes, attr, None)
        except ImportError:
            return None
    return None
