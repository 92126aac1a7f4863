"""Precision recipes that `fpsim.emulate` runs: autocast FP16/BF16, and FP8 on top of one.

    "fp32"      no emulation (the reference run)
    "fp16"      AutocastRecipe("fp16"): torch.autocast with float16 (pair it with a loss scale)
    "bf16"      AutocastRecipe("bf16"): torch.autocast with bfloat16
    "fp8"       FP8Recipe(): E4M3 forward, E5M2 backward, delayed scaling, the rest in bf16 autocast
    "fp8-e4m3"  FP8Recipe(format="e4m3"): E4M3 forward and backward

Recipe objects are frozen dataclasses and need no torch until a scale is computed: they can
be made, compared and printed anywhere (the command line checks them before a script starts).

FP8 scaling objects implement one interface, `scale(history, fp8_max, previous) -> scale`
(0-dim float32 tensors; `history`: amaxes, oldest first), with `history_len` and `delayed`:

* ``delayed = True``: the scale comes from earlier amaxes only (`history` holds at most
  `history_len` of them); the tensor's own amax joins the history after it is cast;
* ``delayed = False``: the scale comes from the tensor's own amax (`history` is it alone).

`DelayedScaling` and `CurrentScaling` implement it for now; fpsim.recipes' objects (issue
14) can take their place when they implement the same method.
"""

from __future__ import annotations

import dataclasses

AUTOCAST_FORMATS = ("fp16", "bf16")
FORMATS = {"hybrid": ("e4m3", "e5m2"), "e4m3": ("e4m3", "e4m3")}
"""FP8 format name -> (forward tensors' format, backward tensors' format)."""


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """TransformerEngine's delayed scaling: the scale of a tensor comes from the amaxes it had before.

    Source: TransformerEngine's ``transformer_engine.common.recipe.DelayedScaling`` (docs:
    "Use scale factor from previous iteration and record amax history of amax_history_len
    steps"; ``new_scaling_factor = (FP8_MAX / amax) / (2 ^ margin)``) and the kernel that
    computes it (transformer_engine/common/recipe/delayed_scaling.cu):

    * amax: the largest of the last `amax_history_len` amaxes (``"max"``, TE's default), or
      the last one (``"most_recent"``);
    * scale = (FP8_MAX * 2^-margin) / amax in float32, when amax is finite and positive;
      otherwise the previous scale is kept (1 at the start, TE's initial scale).

    TE updates the scales once per forward and once per backward pass; here each tensor's scale
    is updated after each cast of it, which is the same for a layer called once per pass.
    """

    margin: float = 0
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    delayed = True

    def __post_init__(self):
        if not isinstance(self.amax_history_len, int) or isinstance(self.amax_history_len, bool) \
                or self.amax_history_len < 1:
            raise ValueError(f"amax_history_len must be a positive int, got {self.amax_history_len!r}")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {self.amax_compute_algo!r}")
        if isinstance(self.margin, bool) or not isinstance(self.margin, (int, float)) or self.margin != self.margin:
            raise ValueError(f"margin must be a number, got {self.margin!r}")

    @property
    def history_len(self) -> int:
        return self.amax_history_len

    def scale(self, history, fp8_max: float, previous):
        import torch

        amax = history.max() if self.amax_compute_algo == "max" else history[-1]
        scaled_max = torch.tensor(fp8_max * 2.0 ** -self.margin, dtype=torch.float32, device=history.device)
        usable = torch.isfinite(amax) & (amax > 0)
        return torch.where(usable, scaled_max / amax, previous)


@dataclasses.dataclass(frozen=True)
class CurrentScaling:
    """TransformerEngine's current (per-tensor) scaling: each tensor is scaled by its own amax.

    Source: TransformerEngine's ``Float8CurrentScaling`` recipe (defaults: ``amax_epsilon=0``,
    ``power_2_scale=False``) and ``compute_scale_from_amax``
    (transformer_engine/common/recipe/recipe_common.cuh): amax is raised to `amax_epsilon`;
    an amax that is zero, Inf or NaN gives scale 1; scale = FP8_MAX / amax in float32
    (round to nearest), float32's max where that overflows, and with `power_2_scale` the
    scale's mantissa bits are cleared (the power of two at or below it).
    """

    amax_epsilon: float = 0.0
    power_2_scale: bool = False

    delayed = False
    history_len = 1

    def __post_init__(self):
        if isinstance(self.amax_epsilon, bool) or not isinstance(self.amax_epsilon, (int, float)) \
                or not self.amax_epsilon >= 0:
            raise ValueError(f"amax_epsilon must be a number >= 0, got {self.amax_epsilon!r}")
        if not isinstance(self.power_2_scale, bool):
            raise ValueError(f"power_2_scale must be True or False, got {self.power_2_scale!r}")

    def scale(self, history, fp8_max: float, previous):
        import torch

        amax = torch.clamp(history[-1], min=self.amax_epsilon)
        scale = torch.tensor(fp8_max, dtype=torch.float32, device=history.device) / amax
        scale = torch.where(torch.isinf(scale), torch.finfo(torch.float32).max, scale)
        if self.power_2_scale:
            scale = (scale.view(torch.int32) & -0x800000).view(torch.float32)   # keep sign and exponent bits
        usable = torch.isfinite(amax) & (amax != 0)
        return torch.where(usable, scale, torch.ones_like(scale))


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


@dataclasses.dataclass(frozen=True)
class FP8Recipe:
    """FP8 linear layers as TransformerEngine runs them, the rest of the model under `base`.

    format: ``"hybrid"``: E4M3 for the forward pass's tensors (activations, weights) and
        E5M2 for gradients, the recommendation of Micikevicius et al. 2022, "FP8 Formats for
        Deep Learning" (arXiv:2209.05433), and TransformerEngine's ``Format.HYBRID``;
        ``"e4m3"``: E4M3 for all (TE's ``Format.E4M3``).
    scaling: per-tensor scales: `DelayedScaling()` (TE's default recipe; amax history 1024,
        max, margin 0) or `CurrentScaling()`; any object with the same `scale` method.
    base: the recipe of everything but the FP8 GEMMs: ``"bf16"`` (autocast bfloat16, as TE
        is usually run), ``"fp16"`` or ``"fp32"``; the FP8 layers' outputs are in its format.
    fast_accumulation: the GEMMs (``"fprop"``, ``"dgrad"``, ``"wgrad"``) that accumulate in the
        tensor core's own FP8 accumulator; the others add their partial sums into FP32 every
        `promote_every` products. Defaults as TE's ``fp8_gemm_fprop``/``dgrad``/``wgrad``
        ``MMParams(use_split_accumulator=False/True/True)``; 128 is cuBLAS's and DeepSeek-V3's
        interval (4 WGMMA instructions on Hopper). Only a tensor-core model (``device=``) uses
        them: with FP32 accumulation every GEMM sums in float32.
    """

    format: str = "hybrid"
    scaling: object = DelayedScaling()
    base: str = "bf16"
    fast_accumulation: tuple = ("fprop",)
    promote_every: int = 128

    def __post_init__(self):
        if self.format not in FORMATS:
            raise ValueError(f"FP8Recipe format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if not callable(getattr(self.scaling, "scale", None)) or not hasattr(self.scaling, "delayed"):
            raise TypeError(f"FP8Recipe scaling must be a scaling object (DelayedScaling(), CurrentScaling() or one "
                            f"with scale(history, fp8_max, previous), delayed and history_len), got {self.scaling!r}")
        if self.base not in AUTOCAST_FORMATS + ("fp32",):
            raise ValueError(f"FP8Recipe base must be one of bf16, fp16, fp32, got {self.base!r}")
        object.__setattr__(self, "fast_accumulation", tuple(self.fast_accumulation))
        unknown = set(self.fast_accumulation) - {"fprop", "dgrad", "wgrad"}
        if unknown:
            raise ValueError(f"FP8Recipe fast_accumulation takes fprop, dgrad, wgrad, got {sorted(unknown)}")
        if isinstance(self.promote_every, bool) or not isinstance(self.promote_every, int) or self.promote_every < 1:
            raise ValueError(f"FP8Recipe promote_every must be a positive int, got {self.promote_every!r}")

    @property
    def name(self) -> str:
        return "fp8" if self.format == "hybrid" else f"fp8-{self.format}"

    @property
    def low(self) -> str | None:
        return None if self.base == "fp32" else self.base


NAMED = {
    "fp16": AutocastRecipe("fp16"),
    "bf16": AutocastRecipe("bf16"),
    "fp8": FP8Recipe(),
    "fp8-e4m3": FP8Recipe(format="e4m3"),
}


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


__all__ = ["AutocastRecipe", "CurrentScaling", "DelayedScaling", "FP8Recipe", "NAMED", "resolve"]
