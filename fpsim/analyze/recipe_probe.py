"""Scaling recipes measured on the run's own tensors: what FP8, FP6 and FP4 recipes lose, per layer and kind.

On sampled steps (`recipes_every=N`: steps 0, N, 2N, ... that are also
observed), `watch` hands this probe the tensors it already sees for each
recorded module: its output (`activation`), the gradient of that output
(`activation_grad`), its parameters of two or more dimensions before the
optimizer step (`weight`; biases and norm scales are no GEMM operand, and
FP8 recipes keep them in BF16/FP32) and their gradients as backward
produced them (`weight_grad`). Each is quantised with every CANDIDATE, by
fpsim's own recipes (fpsim.recipes) and block formats (fpsim.encode and
fpsim.quantize, the compiled kernel), and what it loses is pooled per
(layer, kind, recipe) as effect.RowMass defines it: per row of the tensor's
GEMM view, ||q(x) - x|| / ||x|| and the shares of its mass flushed to zero
and clipped, summed over the rows (recipe_choice takes the means).

The GEMM view: weights and weight gradients as (out, in * ...), activations
and their gradients as (rows, last dim), a vector as one row; per-channel
scaling is row-wise on it, 1x128 blocks run along its rows, 128x128 blocks
tile it. Bounds: a tensor of more than `max_elements` values is measured on
evenly spaced chunks of 128 whole rows up to that size (at least one; its
scales are those of the chunks), and at most `max_tensors` (layer, kind)
pairs are measured per sampled step (more take turns, in groups in the order
first seen), so a sampled step costs about the same whatever the model.
Delayed scaling keeps one amax history per tensor (told apart by its order
in the step) over the sampled steps, so its first sample only records an amax.

The probe reads tensors (a copy on the host) and never writes one; it
draws no random numbers (every recipe rounds to nearest even). An error
inside it stops the probe alone, with a warning; the run goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
import weakref

import numpy as np

from .. import recipes as scaling
from ..blocks import format as get_format
from ..codec import decode, encode
from ..rounding import quantize
from .effect import LOSS_SUMS, RowMass
from .limits import FormatLimits
from .readable import real_parts

RECIPE_KINDS = ("activation", "activation_grad", "weight", "weight_grad")
"""The tensor kinds the recipes are judged on (the GEMM operands and results a layer owns)."""
DEFAULT_MAX_ELEMENTS = 1 << 14
"""Values measured per tensor (whole 128-row chunks, at least one)."""
DEFAULT_MAX_TENSORS = 64
"""(layer, kind) pairs measured per sampled step; a model with more takes turns over several sampled steps."""
DELAYED_HISTORY = 16
"""Amax history of delayed scaling, in sampled tensors."""
_ROWS = 128


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One scaling recipe the probe measures: its name, element width, how it scales, and what quantises."""

    name: str
    width: str             # "fp8", "fp6", "fp4"
    scaling: str           # in words
    recipe: object         # a fpsim.recipes object (per-tensor, per-channel) or a BlockFormat


def _candidates() -> tuple:
    out = []
    for elem in ("e4m3", "e5m2"):
        out.append(Candidate(f"delayed_{elem}", "fp8", "per-tensor, delayed (amax history)",
                             scaling.DelayedScaling(elem, amax_history_len=DELAYED_HISTORY)))
    for elem in ("e4m3", "e5m2"):
        out.append(Candidate(f"current_{elem}", "fp8", "per-tensor, current", scaling.CurrentScaling(elem)))
    for elem in ("e4m3", "e5m2"):
        out.append(Candidate(f"per_channel_{elem}", "fp8", "per row", scaling.PerChannelScaling(elem)))
    out.append(Candidate("block_128x128", "fp8", "FP32 scale per 128x128 block", get_format("fp8_block_128x128")))
    out.append(Candidate("block_1x128", "fp8", "FP32 scale per 1x128 block", get_format("fp8_block_1x128")))
    for name in ("mxfp8_e4m3", "mxfp8_e5m2"):
        out.append(Candidate(name, "fp8", "E8M0 scale per 32", get_format(name)))
    out.append(Candidate("mxfp4", "fp4", "E8M0 scale per 32", get_format("mxfp4")))
    out.append(Candidate("nvfp4", "fp4", "E4M3 scale per 16, FP32 tensor scale", get_format("nvfp4")))
    for name in ("mxfp6_e2m3", "mxfp6_e3m2"):
        out.append(Candidate(name, "fp6", "E8M0 scale per 32", get_format(name)))
    return tuple(out)


CANDIDATES = _candidates()
"""Every recipe measured, by name in CANDIDATE_NAMES order."""
CANDIDATE_NAMES = tuple(c.name for c in CANDIDATES)


def gemm_view(array: np.ndarray, kind: str) -> np.ndarray:
    """The 2-D view a tensor is scaled in: (out, rest) for weights and their gradients, (rows, last) else."""
    if array.ndim == 0:
        return array.reshape(1, 1)
    if array.ndim == 1:
        return array.reshape(1, -1)
    if kind in ("weight", "weight_grad"):
        return array.reshape(array.shape[0], -1)
    return array.reshape(-1, array.shape[-1])


def bounded_rows(view: np.ndarray, max_elements: int) -> np.ndarray:
    """At most max_elements values of a 2-D view (at least one 128-row chunk): evenly spaced whole chunks."""
    rows, cols = view.shape
    chunks = -(-rows // _ROWS)
    keep = max(1, max_elements // max(1, _ROWS * cols))
    if keep >= chunks:
        return view
    starts = np.linspace(0, chunks - 1, keep).round().astype(int) * _ROWS
    return np.concatenate([view[s:s + _ROWS] for s in starts])


def _beyond(element_values, limits: FormatLimits) -> np.ndarray:
    """Where |value| in the element's units passes the element format's overflow threshold."""
    t = limits.overflow_threshold
    return (element_values > t) | ((element_values == t) if limits.tie_overflows else False)


def _expand(unit: np.ndarray, block_shape: tuple, shape: tuple) -> np.ndarray:
    """Per-block values repeated over their blocks of a 2-D array of `shape` (partial blocks cut)."""
    if len(block_shape) == 1:
        return np.repeat(unit, block_shape[0], axis=-1)[:, :shape[1]]
    return np.repeat(np.repeat(unit, block_shape[0], axis=0), block_shape[1], axis=1)[:shape[0], :shape[1]]


@functools.lru_cache(maxsize=None)
def _limits(fmt) -> FormatLimits:
    return FormatLimits.of(fmt)


def measure(view: np.ndarray, candidate: Candidate, state=None, mass: RowMass | None = None) -> np.ndarray | None:
    """LOSS_SUMS of one 2-D float32 view under one candidate (None: delayed scaling's first sample).

    mass: RowMass(view), when the caller measures several candidates on the same view.
    """
    recipe = candidate.recipe
    mass = RowMass(view) if mass is None else mass
    if isinstance(recipe, scaling.DelayedScaling):
        first = not state.history
        scale = np.float64(state.scale)
        q = recipe.quantize(view, state)
        if first:
            return None
        element, fmt = mass.magnitude * scale, recipe.format
    elif isinstance(recipe, (scaling.CurrentScaling, scaling.PerChannelScaling)):
        scale = np.asarray(recipe.scale(view), dtype=np.float64)
        q = recipe.quantize(view)
        element, fmt = mass.magnitude * scale, recipe.format
    else:
        enc = encode(view, recipe)            # for its scales; the values come from the faster quantize
        q = quantize(view, recipe)
        unit = decode(enc.scales, recipe.scale).astype(np.float64)
        if enc.tensor_scale is not None:
            unit = unit * float(enc.tensor_scale)
        unit = _expand(unit, recipe.block_shape, view.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            element = np.where(unit > 0, mass.magnitude / unit, 0.0)   # a zero scale flushes: lost, not clipped
        fmt = recipe.element_format
    return mass.loss_sums(q, _beyond(element, _limits(fmt)))


class RecipeProbe:
    """The sums of every candidate per (layer, kind), over the sampled steps; see the module docstring."""

    def __init__(self, every: int, max_elements: int = DEFAULT_MAX_ELEMENTS, max_tensors: int = DEFAULT_MAX_TENSORS):
        _check_positive("recipes_every", every)
        check_recipe_bounds(max_elements, max_tensors)
        self.every, self.max_elements, self.max_tensors = every, max_elements, max_tensors
        self.sums: dict = {}          # (layer, kind) -> float64[candidates, LOSS_SUMS]
        self.measured: dict = {}      # (layer, kind) -> int[candidates]: tensors each candidate measured
        self.tensors: dict = {}       # (layer, kind) -> tensors measured
        self.values: dict = {}        # (layer, kind) -> values measured
        self.skipped: dict = {}       # (layer, kind) -> tensors left out (non-finite values)
        self.states: dict = {}        # (layer, kind, order in the step) -> delayed scaling state per candidate
        self.steps: list = []         # the sampled steps
        self.error = None
        self._order: dict = {}        # (layer, kind) -> tensors seen this step
        self._index: dict = {}        # (layer, kind) -> its number, in the order first seen
        self._turn: set = set()       # the pairs measured this step
        self._known = 0               # pairs known when this sampled step began
        self._samples = 0             # sampled steps so far
        self._seen: dict = {}         # (layer, kind, id) -> (weakref, version) of the tensors seen this step

    def wants(self, step: int) -> bool:
        return self.error is None and step % self.every == 0

    def observe(self, name: str, kind: str, tensor, inverse_scale=None) -> None:
        """Measure one tensor of layer `name` (torch; inverse_scale: a GradScaler's 1/scale to divide out)."""
        if self.error is not None or kind not in RECIPE_KINDS:
            return
        try:
            if kind in ("weight", "weight_grad") and tensor.dim() < 2:
                return                    # biases and norm scales are no GEMM operand: FP8 recipes keep them wide
            key, version = (name, kind, id(tensor)), tensor._version
            seen = self._seen.get(key)    # the same tensor reaching a second hook (an id alone may be reused)
            if seen is not None and seen[0]() is tensor and seen[1] == version:
                return
            self._seen[key] = (weakref.ref(tensor), version)
            if not self._in_turn((name, kind)):
                return
            array = _host_float32(tensor, inverse_scale)
            if array is None:
                return
            self._measure(name, kind, array)
        except Exception as err:   # the probe stops; observation and training go on
            self.error = f"{type(err).__name__}: {err}"
            warnings.warn(f"fpsim.watch: the recipe measurements stopped after an error ({self.error})",
                          RuntimeWarning, stacklevel=2)

    def _in_turn(self, pair) -> bool:
        """Whether a (layer, kind) is measured on this sampled step: at most max_tensors pairs a step, taking
        turns in groups of max_tensors (in the order first seen), so that every pair comes round."""
        index = self._index.setdefault(pair, len(self._index))
        if pair in self._turn:
            return True
        rounds = max(1, -(-self._known // self.max_tensors))
        if len(self._turn) >= self.max_tensors or (index // self.max_tensors) % rounds != self._samples % rounds:
            return False
        self._turn.add(pair)
        return True

    def _measure(self, name: str, kind: str, array: np.ndarray) -> None:
        pair = (name, kind)
        order = self._order.get(pair, 0)
        self._order[pair] = order + 1
        if not np.isfinite(array).all():
            self.skipped[pair] = self.skipped.get(pair, 0) + 1
            return
        view = np.ascontiguousarray(bounded_rows(gemm_view(array, kind), self.max_elements))
        states = self.states.setdefault((name, kind, order), {})
        sums = self.sums.setdefault(pair, np.zeros((len(CANDIDATES), len(LOSS_SUMS))))
        measured_by = self.measured.setdefault(pair, np.zeros(len(CANDIDATES), dtype=np.int64))
        mass = RowMass(view)
        for i, candidate in enumerate(CANDIDATES):
            state = None
            if isinstance(candidate.recipe, scaling.DelayedScaling):
                state = states.setdefault(candidate.name, candidate.recipe.new_state())
            measured = measure(view, candidate, state, mass)
            if measured is not None:
                sums[i] += measured
                measured_by[i] += 1
        self.tensors[pair] = self.tensors.get(pair, 0) + 1
        self.values[pair] = self.values.get(pair, 0) + view.size

    def end_step(self, step: int, sampled: bool) -> None:
        """A step ended: remember it if it was sampled, start the next one's tensor order."""
        if sampled and self._index:
            self.steps.append(step)
            self._samples += 1
            self._known = len(self._index)
        self._order, self._seen, self._turn = {}, {}, set()

    def measurements(self) -> dict:
        """{layer: {kind: {"tensors", "values", "skipped_nonfinite", "measured": {candidate: tensors},
        "sums": {candidate: [LOSS_SUMS]}}}}."""
        out: dict = {}
        for (name, kind), sums in self.sums.items():
            out.setdefault(name, {})[kind] = {
                "tensors": self.tensors.get((name, kind), 0), "values": self.values.get((name, kind), 0),
                "skipped_nonfinite": self.skipped.get((name, kind), 0),
                "measured": {c: int(n) for c, n in zip(CANDIDATE_NAMES, self.measured[(name, kind)])},
                "sums": {c: sums[i].tolist() for i, c in enumerate(CANDIDATE_NAMES)}}
        return out

    def describe(self) -> dict:
        return {"every": self.every, "max_elements": self.max_elements, "max_tensors": self.max_tensors,
                "steps": list(self.steps),
                "delayed_history": DELAYED_HISTORY, "error": self.error}


def check_recipe_bounds(max_elements, max_tensors) -> None:
    """recipe_max_elements and recipe_max_tensors: positive ints (ValueError naming the value otherwise)."""
    _check_positive("recipe_max_elements", max_elements)
    _check_positive("recipe_max_tensors", max_tensors)


def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _host_float32(tensor, inverse_scale):
    """A float32 numpy copy of a torch tensor (divided by a GradScaler's scale), None when empty or not dense. A
    complex tensor as its real and imaginary parts side by side along its last dimension (re, im, re, im, ...):
    each part is a value of the format."""
    import torch

    t = tensor.detach()
    if t.layout != torch.strided or not t.numel() or type(t) is not torch.Tensor:   # sparse, empty, DTensor
        return None
    if t.is_complex():
        t = real_parts(t)
        t = t.reshape(*t.shape[:-2], -1)
    t = t.float()
    if inverse_scale is not None:
        t = t * inverse_scale.to(t.device)
    return t.cpu().numpy().copy()
