"""Precision recipes that `fpsim.emulate` runs: autocast FP16/BF16, and FP8 on top of one.

    "fp32"        no emulation (the reference run)
    "fp16"        AutocastRecipe("fp16"): torch.autocast with float16 (pair it with a loss scale)
    "bf16"        AutocastRecipe("bf16"): torch.autocast with bfloat16
    "fp8"         FP8Recipe(): E4M3 forward, E5M2 backward, delayed scaling, the rest in bf16 autocast
    "fp8-e4m3"    E4M3 forward and backward, delayed scaling
    "fp8-current" E4M3 forward, E5M2 backward, current scaling (TE's Float8CurrentScaling)
    "mxfp8"       MXFP8: E4M3 elements, one E8M0 scale per 32 (TE's MXFP8BlockScaling)
    "fp8-block"   DeepSeek-V3's 1x128 / 128x128 FP32-scaled blocks

How a tensor is scaled (amax history, margin, the scale's formula, its formats) is
fpsim.recipes' fact: an FP8Recipe holds one of its recipe objects (DelayedScaling,
CurrentScaling, PerChannelScaling, BlockScaling) and adds what only training needs: which
format runs the rest of the model, and how the GEMMs accumulate. Recipe objects are frozen
dataclasses and need no torch: they can be made, compared and printed anywhere (the command
line checks them before a script starts).
"""

from __future__ import annotations

import dataclasses

from .. import recipes as scaling_recipes

AUTOCAST_FORMATS = ("fp16", "bf16")
PER_TENSOR = (scaling_recipes.DelayedScaling, scaling_recipes.CurrentScaling)
"""Scalings with one scale per tensor: their GEMMs take the FP8 elements and the two inverse scales
(and so can run on a tensor-core model); the others' GEMMs take dequantised values."""

# fpsim.recipes' objects, re-exported: fpsim.emulate.DelayedScaling is fpsim.recipes.DelayedScaling
DelayedScaling = scaling_recipes.DelayedScaling
CurrentScaling = scaling_recipes.CurrentScaling
PerChannelScaling = scaling_recipes.PerChannelScaling
BlockScaling = scaling_recipes.BlockScaling

HYBRID = DelayedScaling("e4m3", gradient_format="e5m2")
"""TransformerEngine's default: DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=1024, "max", margin 0)."""


@dataclasses.dataclass(frozen=True)
class AutocastRecipe:
    """torch.autocast's mixed precision: the ops of its op policy run in `format` (fp16 or bf16),
    the others in FP32 or promoted, with FP32 master weights (`fpsim.emulate.policy`)."""

    format: str = "bf16"

    def __post_init__(self):
        if self.format not in AUTOCAST_FORMATS:
            raise ValueError(f"AutocastRecipe format must be one of {', '.join(AUTOCAST_FORMATS)}, got {self.format!r}")

    @property
    def name(self) -> str:
        return self.format

    @property
    def low(self) -> str | None:
        """The autocast format of the ops outside FP8 GEMMs (None: FP32)."""
        return self.format


_GEMMS = ("fprop", "dgrad", "wgrad")


def _gemm_names(value) -> tuple:
    """fast_accumulation as a tuple of GEMM names: one name, or an iterable of them (a string is
    one name, not its letters)."""
    names = (value,) if isinstance(value, str) else value
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"FP8Recipe fast_accumulation takes a GEMM name or names ({', '.join(_GEMMS)}), "
                        f"got {value!r}") from None
    unknown = [name for name in names if name not in _GEMMS]
    if unknown:
        raise ValueError(f"FP8Recipe fast_accumulation takes {', '.join(_GEMMS)}, got unknown {unknown!r}")
    return names


@dataclasses.dataclass(frozen=True)
class FP8Recipe:
    """FP8 linear layers as TransformerEngine runs them, the rest of the model under `base`.

    scaling: a fpsim.recipes recipe: how each GEMM input (activation, weight, output
        gradient) is scaled and which format it takes (`format_for(kind)`). Default
        `DelayedScaling("e4m3", gradient_format="e5m2")`: TE's default recipe (HYBRID: E4M3
        forward, E5M2 backward, the recommendation of Micikevicius et al. 2022, "FP8 Formats
        for Deep Learning", arXiv:2209.05433; amax history 1024, max, margin 0).
        `CurrentScaling(...)` scales each tensor by its own amax; `PerChannelScaling` and
        `BlockScaling` (MXFP8, DeepSeek-V3's blocks) quantise each tensor once along its last
        axis, and their GEMMs take the dequantised values in FP32.
    base: the recipe of everything but the FP8 GEMMs: ``"bf16"`` (autocast bfloat16, as TE
        is usually run), ``"fp16"`` or ``"fp32"``; the FP8 layers' outputs are in its format.
    fast_accumulation: the GEMM or GEMMs (``"fprop"``, ``"dgrad"``, ``"wgrad"``) that accumulate in the
        tensor core's own FP8 accumulator; the others add their partial sums into FP32 every
        `promote_every` products. Defaults as TE's ``fp8_gemm_fprop``/``dgrad``/``wgrad``
        ``MMParams(use_split_accumulator=False/True/True)``; 128 is cuBLAS's and DeepSeek-V3's
        interval (4 WGMMA instructions on Hopper). Only a tensor-core model (``device=``) uses
        them: with FP32 accumulation every GEMM sums in float32.
    """

    scaling: object = HYBRID
    base: str = "bf16"
    fast_accumulation: tuple = ("fprop",)
    promote_every: int = 128

    def __post_init__(self):
        if not isinstance(self.scaling, tuple(scaling_recipes.RECIPES.values())):
            raise TypeError(f"FP8Recipe scaling must be a scaling object of fpsim.recipes "
                            f"({', '.join(c.__name__ for c in scaling_recipes.RECIPES.values())}), "
                            f"got {self.scaling!r}")
        if self.base not in AUTOCAST_FORMATS + ("fp32",):
            raise ValueError(f"FP8Recipe base must be one of bf16, fp16, fp32, got {self.base!r}")
        object.__setattr__(self, "fast_accumulation", _gemm_names(self.fast_accumulation))
        if isinstance(self.promote_every, bool) or not isinstance(self.promote_every, int) or self.promote_every < 1:
            raise ValueError(f"FP8Recipe promote_every must be a positive int, got {self.promote_every!r}")

    @property
    def name(self) -> str:
        """Its name in NAMED, else fp8-<scaling>-<forward format>[-<backward format>]."""
        for key, recipe in NAMED.items():
            if recipe == self:
                return key
        forward, backward = self.element_formats
        return f"fp8-{self.scaling.name}-{forward}" + ("" if backward == forward else f"-{backward}")

    @property
    def per_tensor(self) -> bool:
        return isinstance(self.scaling, PER_TENSOR)

    @property
    def element_formats(self) -> tuple:
        """(forward tensors' element format, output gradients' element format), as names."""
        def element(kind):
            fmt = self.scaling.format_for(kind)
            return getattr(fmt, "element", fmt).name
        return element("activation"), element("gradient")

    @property
    def low(self) -> str | None:
        return None if self.base == "fp32" else self.base


NAMED = {
    "fp16": AutocastRecipe("fp16"),
    "bf16": AutocastRecipe("bf16"),
    "fp8": FP8Recipe(),
    "fp8-e4m3": FP8Recipe(DelayedScaling("e4m3")),
    "fp8-current": FP8Recipe(CurrentScaling("e4m3", gradient_format="e5m2")),
    "mxfp8": FP8Recipe(BlockScaling("mxfp8_e4m3", "mxfp8_e4m3", "mxfp8_e4m3")),
    "fp8-block": FP8Recipe(BlockScaling()),
}
"""Named recipes. mxfp8 is E4M3 throughout, as TE's MXFP8BlockScaling (fp8_format=Format.E4M3 by
default); fp8-current is HYBRID as TE's Float8CurrentScaling's default."""


def resolve(recipe):
    """A recipe object from a name or an object; None for "fp32" (no emulation)."""
    if isinstance(recipe, (AutocastRecipe, FP8Recipe)):
        return recipe
    if isinstance(recipe, str):
        key = recipe.lower()
        if key == "fp32":
            return None
        if key in NAMED:
            return NAMED[key]
        raise ValueError(f"unknown recipe {recipe!r}; known: fp32, {', '.join(NAMED)}, or an AutocastRecipe or "
                         f"FP8Recipe object")
    raise TypeError(f"recipe must be a name (fp32, {', '.join(NAMED)}) or an AutocastRecipe or FP8Recipe object, "
                    f"got {type(recipe).__name__} {recipe!r}")


__all__ = ["AutocastRecipe", "BlockScaling", "CurrentScaling", "DelayedScaling", "FP8Recipe", "NAMED", "PerChannelScaling",
           "resolve"]
