"""Precision recipes: how a tensor is scaled before it is cast to FP8, shared by analyze and emulate.

Numerics only: each recipe computes scales from amaxes and applies them with
fpsim's exact rounding, on numpy arrays and torch tensors alike (torch is
never imported here). The autocast op policy (which ops run in which
precision, issue 13) will live here too.

    recipe = DelayedScaling("e4m3", amax_history_len=16, gradient_format="e5m2")   # TE's HYBRID
    state = recipe.new_state()               # one per tensor
    y = recipe.quantize(x, state)            # uses the scale from earlier steps, then records amax(x)
    CurrentScaling("e4m3").quantize(x)       # scale from x itself
    PerChannelScaling("e4m3").quantize(w)    # one scale per row
    BlockScaling().quantize(w, kind="weight")   # DeepSeek-V3's 128x128 blocks (fpsim.blocks)

Every recipe's quantize(x, state=None, *, kind=, rounding=, seed=, generator=)
takes the tensor's kind ("activation", "weight", "gradient"), so that the
analyzer and emulate can treat them alike.

Per-tensor and per-channel recipes follow TransformerEngine's convention:
the scale multiplies, elements = fmt(x * scale) with saturation (TE's casts
are satfinite), and the dequantised value is element * scale_inv with
scale_inv = fl32(1 / scale), as TE stores it for the GEMM. Elements are the
single rounding of the exact product x * scale (TE's kernels round x * scale
to FP32 first: they differ where that product lies within an FP32 ulp of a
rounding boundary). Dequantised values come back as float64 (exact).
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from . import block_codec
from ._arrays import straight_through_of
from ._fpmode import subnormals_kept
from .blocks import BLOCK_PRESETS, BlockFormat, format as get_format
from .formats import PRESETS, Format
from .modes import check_rounding
from .quotient import round_product, round_quotient

__all__ = ["KINDS", "RECIPES", "BlockScaling", "CurrentScaling", "DelayedScaling", "DelayedScalingState",
           "PerChannelScaling", "scale_from_amax"]

_FP32 = PRESETS["fp32"]
_FP32_MAX = np.float32(_FP32.max)


KINDS = ("activation", "weight", "gradient")
"""What a quantised tensor is: every recipe's quantize takes kind= (gradients may use another format)."""


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown tensor kind {kind!r}; allowed: {', '.join(KINDS)}")
    return kind


# ---------------------------------------------------------- argument checks
# One check per argument name, shared by every recipe class (`_validate`) and by scale_from_amax: an
# argument is refused the same way whichever recipe takes it.
_ELEMENT_FORMATS = tuple(name for name, f in PRESETS.items() if f.signed and f.zero)
"""The named formats a scaled tensor can be cast to (signed, with a zero); any custom Format like them works."""


def _element_format(owner: str, name: str, fmt) -> Format:
    fmt = get_format(fmt)
    if not isinstance(fmt, Format):
        raise TypeError(f"{owner}: {name} must be an element format: a per-tensor recipe scales into an element "
                        f"format, not the block format {fmt.name}; allowed: {', '.join(_ELEMENT_FORMATS)} "
                        "or a signed Format")
    if not (fmt.signed and fmt.zero):
        lacks = "is unsigned" if not fmt.signed else "has no zero"
        raise ValueError(f"{owner}: {name}={fmt.name!r} {lacks}, and a scaled tensor holds negative values and "
                         f"zeros; allowed: {', '.join(_ELEMENT_FORMATS)} or a signed Format with a zero")
    return fmt


def _block_format(owner: str, name: str, fmt) -> BlockFormat:
    fmt = get_format(fmt)
    if not isinstance(fmt, BlockFormat):
        raise TypeError(f"{owner}: {name} must be a block format, got {fmt.name}; allowed: "
                        f"{', '.join(BLOCK_PRESETS)} or a BlockFormat")
    return fmt


def _int(owner: str, name: str, value, minimum: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner}: {name} must be an int{'' if minimum is None else f' >= {minimum}'}, "
                        f"got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def _flag(owner: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{owner}: {name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def _epsilon(owner: str, name: str, value) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a real number >= 0, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{owner}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _choice(owner: str, name: str, value, allowed) -> str:
    if not isinstance(value, str) or value not in allowed:
        names = [repr(a) for a in allowed]
        listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
        raise ValueError(f"{owner}: {name} must be {listed}, got {value!r}")
    return value


_CHECKS = {
    "format": lambda owner, v: _element_format(owner, "format", v),
    "gradient_format": lambda owner, v: None if v is None else _element_format(owner, "gradient_format", v),
    "margin": lambda owner, v: _int(owner, "margin", v, 0),
    "amax_history_len": lambda owner, v: _int(owner, "amax_history_len", v, 1),
    "amax_compute_algo": lambda owner, v: _choice(owner, "amax_compute_algo", v, ("max", "most_recent")),
    "power_of_two": lambda owner, v: _flag(owner, "power_of_two", v),
    "amax_epsilon": lambda owner, v: _epsilon(owner, "amax_epsilon", v),
    "axis": lambda owner, v: _int(owner, "axis", v),
    "activations": lambda owner, v: _block_format(owner, "activations", v),
    "weights": lambda owner, v: _block_format(owner, "weights", v),
    "gradients": lambda owner, v: _block_format(owner, "gradients", v),
}
"""The check of each recipe argument, by name: it returns the value as the recipe keeps it, or raises."""


def _validate(recipe) -> None:
    """Check every argument of a recipe (a frozen dataclass) and keep the checked values; gradients use
    the forward format unless gradient_format names another."""
    owner = type(recipe).__name__
    for field in dataclasses.fields(recipe):
        object.__setattr__(recipe, field.name, _CHECKS[field.name](owner, getattr(recipe, field.name)))
    if hasattr(recipe, "gradient_format") and recipe.gradient_format is None:
        object.__setattr__(recipe, "gradient_format", recipe.format)


def _fl32_div(numerator: float, amax) -> np.ndarray:
    """fl32(numerator / amax) for amax >= 0 (float32 numbers): FP32 division, round to nearest even."""
    return round_quotient(np.full(np.shape(amax), numerator, dtype=np.float32), [amax], _FP32)


def _amax32(amax) -> np.ndarray:
    """Amaxes as FP32 numbers (TE keeps amaxes in FP32): rounded to nearest, up to Inf."""
    amax = np.asarray(amax, dtype=np.float64)
    with np.errstate(over="ignore"):
        return amax.astype(np.float32)


@subnormals_kept
def _amax(x, axis=None) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.max(np.abs(x), axis=axis, keepdims=axis is not None, initial=0.0)


def scale_from_amax(amax, fmt: Format, *, margin: int = 0, power_of_two: bool = False, epsilon: float = 0.0,
                    previous=np.float32(1.0)) -> np.ndarray:
    """TransformerEngine's scale for an amax: fl32(fl32(fmt.max / amax) / 2^margin).

    As TE's compute_scale_from_amax (common/recipe/recipe_common.cuh) and
    _default_sf_compute (pytorch/quantization.py) define it: amax below
    `epsilon` is raised to it; amax 0, Inf or NaN keeps `previous` (TE: the
    previous scale for delayed scaling, 1 for current scaling); a scale that
    overflows FP32 becomes FP32's max; `power_of_two` truncates the scale to
    a power of two (clears its mantissa bits). margin: an int >= 0;
    power_of_two: True or False; epsilon: a finite number >= 0 (checked as
    the recipes check them).
    """
    owner = "scale_from_amax"
    return _scale_from_amax(amax, fmt, _int(owner, "margin", margin, 0), _flag(owner, "power_of_two", power_of_two),
                            _epsilon(owner, "epsilon", epsilon), previous)


@subnormals_kept
def _scale_from_amax(amax, fmt: Format, margin: int, power_of_two: bool, epsilon: float, previous) -> np.ndarray:
    """scale_from_amax with its arguments checked (the recipes checked theirs when they were made)."""
    amax = _amax32(amax)
    amax = np.where(amax < np.float32(epsilon), np.float32(epsilon), amax)
    usable = np.isfinite(amax) & (amax > 0)
    safe = np.where(usable, amax, np.float32(1))
    scale = _fl32_div(float(fmt.max), safe)
    if margin:     # (2^margin past FP32's range as well: the quotient is what TE's gives, 0 or a subnormal)
        scale = round_quotient(scale, [2.0 ** margin], _FP32).astype(np.float32)
    scale = np.where(np.isinf(scale), _FP32_MAX, scale)
    if power_of_two:
        scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return np.where(usable, scale, np.float32(previous)).astype(np.float32)


def _apply(x, scale, fmt: Format, rounding, seed, generator):
    """Dequantised values: fmt(x * scale) * fl32(1 / scale), exact, in float64 (torch in, torch out, with the
    straight-through gradient where x records one)."""
    check_rounding(rounding)
    return straight_through_of(x, lambda x: _dequantised(x, scale, fmt, rounding, seed, generator))


@subnormals_kept
def _dequantised(x, scale, fmt: Format, rounding, seed, generator):
    array, device = block_codec.host_array(x)
    scale = np.asarray(scale, dtype=np.float32)
    rng = {} if rounding != "stochastic" else dict(seed=seed, generator=block_codec.numpy_generator(generator))
    elements = round_product(array, scale, fmt, rounding, saturate=True, **rng)
    scale_inv = _fl32_div(1.0, scale)
    values = elements.astype(np.float64) * scale_inv.astype(np.float64)
    return block_codec.on_device(values, device)


# ------------------------------------------------------------------ recipes
@dataclasses.dataclass
class DelayedScalingState:
    """What delayed scaling carries between steps: the amax history (newest last) and the current scale."""

    history: list = dataclasses.field(default_factory=list)
    scale: np.float32 = np.float32(1.0)


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Per-tensor scale from the amaxes of earlier steps (TransformerEngine's DelayedScaling).

    Source: transformer_engine/common/recipe/__init__.py (DelayedScaling:
    margin, amax_history_len, amax_compute_algo "max" or "most_recent") and
    pytorch/quantization.py (_amax_and_scale_update, _default_sf_compute).
    A step quantises with the current scale (1 at first), records its amax
    in the history (the last `amax_history_len` amaxes) and sets the next
    scale from the history's max ("max") or its newest entry
    ("most_recent"): (fmt.max / amax) / 2^margin in FP32, kept when the
    amax is 0 or not finite (a NaN in the window makes its max NaN, as
    torch.max does in TE). TE's HYBRID format is
    DelayedScaling("e4m3", gradient_format="e5m2"); one state per tensor.
    """

    format: object = "e4m3"
    margin: int = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    gradient_format: object = None

    name = "delayed"

    def __post_init__(self):
        _validate(self)

    def new_state(self) -> DelayedScalingState:
        return DelayedScalingState()

    def record(self, state: DelayedScalingState, amax, kind: str = "activation") -> np.float32:
        """Record one step's amax and return the scale for the next step (also stored in state)."""
        state.history = (state.history + [float(_amax32(amax))])[-self.amax_history_len:]
        if self.amax_compute_algo == "max":   # NaN anywhere in the window is the max (torch.max, as TE's)
            chosen = np.nan if any(a != a for a in state.history) else max(state.history)
        else:
            chosen = state.history[-1]
        state.scale = _scale_from_amax(chosen, self.format_for(kind), self.margin, False, 0.0, state.scale)[()]
        return state.scale

    def format_for(self, kind: str) -> Format:
        return self.gradient_format if _check_kind(kind) == "gradient" else self.format

    def quantize(self, x, state: DelayedScalingState = None, *, kind="activation", rounding="nearest_even",
                 seed=None, generator=None):
        """Dequantised values of x under the state's current scale; then records amax(x)."""
        if not isinstance(state, DelayedScalingState):
            raise TypeError("DelayedScaling.quantize needs the recipe's state: state = recipe.new_state()")
        values = _apply(x, state.scale, self.format_for(kind), rounding, seed, generator)
        self.record(state, _amax(block_codec.host_array(x)[0]), kind)
        return values


@dataclasses.dataclass(frozen=True)
class CurrentScaling:
    """Per-tensor scale from the tensor's own amax (TransformerEngine's Float8CurrentScaling).

    Source: transformer_engine/common/recipe/__init__.py (Float8CurrentScaling,
    QParams power_2_scale and amax_epsilon) and common/recipe/recipe_common.cuh
    (compute_scale_from_amax): scale = fl32(fmt.max / amax); 1 for an amax of
    0, Inf or NaN; FP32's max where it overflows; power_of_two truncates it.
    """

    format: object = "e4m3"
    power_of_two: bool = False
    amax_epsilon: float = 0.0
    gradient_format: object = None

    name = "current"

    def __post_init__(self):
        _validate(self)

    def format_for(self, kind: str) -> Format:
        return self.gradient_format if _check_kind(kind) == "gradient" else self.format

    def scale(self, x, kind: str = "activation") -> np.float32:
        return _scale_from_amax(_amax(block_codec.host_array(x)[0]), self.format_for(kind), 0, self.power_of_two,
                                self.amax_epsilon, np.float32(1.0))[()]

    def quantize(self, x, state=None, *, kind="activation", rounding="nearest_even", seed=None, generator=None):
        return _apply(x, self.scale(x, kind), self.format_for(kind), rounding, seed, generator)


@dataclasses.dataclass(frozen=True)
class PerChannelScaling:
    """One scale per channel: current scaling with the amax of each slice along `axis` (row-wise: axis=-1).

    Source: torchao float8's ROWWISE recipe (torchao/float8/config.py,
    float8_utils.amax_to_scale with axiswise_dim=-1) gives the granularity;
    the scale of each row is TE's current-scaling formula above (torchao
    divides in float64 and rounds to FP32, which can differ in the last bit,
    and clamps the amax to 1e-12 where TE keeps the scale 1 for a zero row).
    """

    format: object = "e4m3"
    axis: int = -1
    power_of_two: bool = False
    gradient_format: object = None

    name = "per_channel"

    def __post_init__(self):
        _validate(self)

    def format_for(self, kind: str) -> Format:
        return self.gradient_format if _check_kind(kind) == "gradient" else self.format

    def scale(self, x, kind: str = "activation") -> np.ndarray:
        """The scales, with `axis` kept as a length-1 axis (they broadcast against x)."""
        array = block_codec.host_array(x)[0]
        if array.ndim < 1 or not -array.ndim <= self.axis < array.ndim:
            raise ValueError(f"axis={self.axis} is out of range for an input of {array.ndim} dimensions")
        return _scale_from_amax(_amax(array, axis=self.axis), self.format_for(kind), 0, self.power_of_two, 0.0,
                                np.float32(1.0))

    def quantize(self, x, state=None, *, kind="activation", rounding="nearest_even", seed=None, generator=None):
        return _apply(x, self.scale(x, kind), self.format_for(kind), rounding, seed, generator)


@dataclasses.dataclass(frozen=True)
class BlockScaling:
    """Block-wise scales from fpsim's block formats: DeepSeek-V3's FP8 recipe by default.

    Source: DeepSeek-V3 technical report, section 3.3 (1x128 tiles for
    activations, 128x128 blocks for weights, FP32 scales) and its
    inference/kernel.py (s = max(amax, 1e-4) / 448); the formats are
    fpsim.BLOCK_PRESETS["fp8_block_1x128"] and ["fp8_block_128x128"]. Any
    BlockFormat works (e.g. "mxfp8_e4m3" for both). TransformerEngine's
    Float8BlockScaling uses the same blocks with power-of-two scales by
    default.
    """

    activations: object = "fp8_block_1x128"
    weights: object = "fp8_block_128x128"
    gradients: object = "fp8_block_1x128"

    name = "block"

    def __post_init__(self):
        _validate(self)

    def format_for(self, kind: str) -> BlockFormat:
        return {"activation": self.activations, "weight": self.weights, "gradient": self.gradients}[_check_kind(kind)]

    def quantize(self, x, state=None, *, kind="activation", rounding="nearest_even", seed=None, generator=None):
        return straight_through_of(x, lambda x: block_codec.quantize(x, self.format_for(kind), rounding, seed=seed,
                                                                     generator=generator))


RECIPES = {r.name: r for r in (DelayedScaling, CurrentScaling, PerChannelScaling, BlockScaling)}
"""The recipe classes by name (for command lines and reports)."""
