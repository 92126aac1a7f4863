"""Shadow steps: replay a sampled training step in low precision and measure what it does to the gradients.

On a shadowed step, before the root model's first forward, its inputs (args
and kwargs), its buffers, the RNG streams and the modules' attribute bindings
are copied (`_RunState`); in the real backward,
the gradient arriving at each of its output tensors is copied too (the loss
function need not be known). Before the optimizer steps (the parameters are
still those the forward used), the step is replayed from these with
torch.func.functional_call on the parameters (detached: no .grad is touched)
and on copies of the buffers (BatchNorm's running stats of the real model stay
as they are), with the RNG streams and attributes set to the captured state
(the same dropout masks, the same state kept from the last step) and put back
after (the run's streams and attributes are untouched):

- FP32 (autocast off): the reference gradient g of every parameter (in a plain FP32 run the real backward's
  gradients, once a replay has matched them: `_reference`);
- FP32 on each half of the batch, gA and gB: the noise floor ||gA - gB|| /
  ||gA + gB|| is the relative noise the FP32 gradient itself carries (the
  halves' difference has the spread of g's own sampling noise; with per-sample
  terms summed gA + gB = g, with a mean taken inside the model gA + gB = 2g and
  gA - gB doubles too, so the ratio holds either way);
- each loss-scaled format that torch.autocast runs (fp16, bf16): the forward
  under autocast's op policy, then one backward per candidate loss scale 2^s,
  the output gradient multiplied by 2^s and cast to the output's dtype, as a
  GradScaler'd backward receives it, the weight gradients divided back. With
  numerics="emulated" (the default) every FP16/BF16 op computes in FP32 and
  rounds its result once (a GPU kernel's numerics, at about FP32's cost); with
  "autocast", torch's own low-precision kernels (on a CPU without FP16/BF16
  matrix units about 15 FP32 steps' time);
- per-tensor-scaled formats (FP8, custom formats of 8 bits or fewer): the FP32
  forward with the operands of every layer's matrix product (F.linear, the
  convolutions, F.bilinear, a product with a parameter), and the gradient
  arriving at its output, fake-quantised with a current per-tensor scale
  (CurrentScaling: format max / amax), straight-through gradients.

The shadowed steps take turns: the first measures the noise floor, the next
replays the reference and the first format, the next the reference and the
second format, and so on round (a batch that cannot be halved gives its turn
to the next format). A shadow step so costs about two FP32 forward-backward
passes whatever the number of formats; each format's means are over its own
turns, and the floor that decides escalation is the mean of those measured.

On a format's first turn where some layer's error stands out of its noise
floor at scale 1, and on every RECHECK_EVERY-th such turn after, one more FP32
replay with every parameter moved by a random share of the format's unit
roundoff gives each layer's weight sensitivity at that precision
(`_sensitivity`; evidence.threshold).

A module whose low-precision output is non-finite while its inputs are finite
is an overflow source; the replay is repeated with the sources kept in FP32 (as
one would), so that the other layers are judged on what remains. A forward
that is to be repeated stops at its first source (replay.SourceFound): the
rest of it would be thrown away.

Per layer (the parameters a module holds itself), format and scale: the
gradient's relative error ||g_lp - g|| / ||g||, its cosine to g, the share of
||g|| lost where g_lp is zero and g is not, and the share of non-finite
values; per layer the noise floor. `ShadowRecord` sums them over shadowed
steps (bounded memory), and also by epoch (memory logarithmic in the run) so
that a change of the numerics during the run shows;
replay.py holds the replay contexts, gradient_error.py the comparison with the
reference, evidence.py turns the sums into verdicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import warnings

from ..trace import ModuleHook, run_eagerly
from .evidence import threshold
from .gradient_error import Reference, flat
from .limits import LOW_PRECISION_DTYPES, is_low_precision
from .nested import float_tensors, is_subclass, leaves, map_leaves
from .readable import widened
from .replay import FP32, Autocast, EmulatedAutocast, FakeQuant, SourceFound

COMMAND_LINE_EVERY = 10
"""How often `fpsim analyze` and `fpsim demo` shadow a step unless told otherwise (--shadow-every 0: value counts
only). fpsim.watch shadows only when asked (shadow_every=N): the replays run your modules again, and hooks you put
on them run with them (docs/verdicts.md, Limits)."""
NARROW_SCALES_LOG2 = (0, 8, 16)
"""Candidate loss scales (log2) for loss-scaled formats narrower than FP32 (fp16)."""
AUTOCAST_DTYPES = {fmt: dtype for dtype, fmt in LOW_PRECISION_DTYPES.items()}
"""The formats torch.autocast runs, and the dtype of each (the replays of these formats are autocast's)."""
NUMERICS = ("emulated", "autocast")
"""How FP16/BF16 shadow steps compute: "emulated", torch.autocast's op policy with each FP16/BF16 op computed in
FP32 and rounded once (replay.EmulatedAutocast: a GPU kernel's numerics, at about FP32's cost); "autocast",
torch's own low-precision kernels (replay.Autocast: on CPUs without FP16/BF16 matrix units ~15x slower)."""
MAX_OVERFLOW_PASSES = 6
"""Replays with more overflow sources kept in FP32 before giving up on finding them all: each but the last stops at
the first new source, so up to 5 are kept (the last replay still records any others)."""
RECHECK_EVERY = 8
"""The real backward's gradients stand in for the FP32 reference replay once a replay has matched them; every
this many format turns the reference is replayed again to check that they still match. Also how often a
format's weight sensitivity is measured again (on its turns with a layer standing out: `_sensitivity`)."""
MATCH_TOLERANCE = 1e-6
"""Relative distance within which the real gradients match the reference replay (FP32 reassociation; the
errors the replays measure are 1e-4 and above)."""


@dataclasses.dataclass
class Sums:
    """What one (layer, format, scale) measured, summed over shadowed steps."""

    steps: int = 0
    finite_steps: int = 0
    rel_error: float = 0.0       # over finite steps
    rel_error_sq: float = 0.0    # over finite steps: the spread of the mean
    cosine: float = 0.0          # over finite steps
    zeroed_share: float = 0.0    # over finite steps
    nonfinite_share: float = 0.0  # over all steps

    def add(self, m: dict) -> None:
        self.steps += 1
        self.nonfinite_share += m["nonfinite_share"]
        if m["nonfinite_share"] == 0:
            self.finite_steps += 1
            self.rel_error += m["rel_error"]
            self.rel_error_sq += m["rel_error"] ** 2
            self.cosine += m["cosine"]
            self.zeroed_share += m["zeroed_share"]

    def means(self) -> dict:
        n = self.finite_steps
        mean = self.rel_error / n if n else math.inf
        spread = None
        if n >= 2 and math.isfinite(self.rel_error_sq):     # the standard error of the mean over the steps
            spread = math.sqrt(max(self.rel_error_sq - n * mean * mean, 0.0) / (n - 1) / n)
        return {"steps": self.steps, "nonfinite_steps": self.steps - n,
                "grad_rel_error": mean, "grad_rel_error_se": spread,
                "cosine": self.cosine / n if n else None,
                "share_zeroed": self.zeroed_share / n if n else None,
                "share_nonfinite": self.nonfinite_share / self.steps if self.steps else 0.0}


@dataclasses.dataclass
class Epochs:
    """A layer's sums of one format and scale by epoch, in memory that grows with the logarithm of the run:
    the format's turn t (1, 2, 3, ...) falls in epoch t.bit_length() - 1, epochs of 1, 2, 4, 8, ... turns."""

    sums: dict = dataclasses.field(default_factory=dict)     # epoch -> Sums

    def add(self, epoch: int, measured: dict) -> None:
        self.sums.setdefault(epoch, Sums()).add(measured)

    def split(self, boundary: int) -> tuple:
        """(early, late): the sums of the epochs before `boundary` and of those from it on."""
        early, late = Sums(), Sums()
        for epoch, sums in self.sums.items():
            target = late if epoch >= boundary else early
            for f in dataclasses.fields(Sums):
                setattr(target, f.name, getattr(target, f.name) + getattr(sums, f.name))
        return early, late


MIN_WINDOW_TURNS = 3
"""Turns each window needs before the record compares a layer's early and late shadowed steps."""


class ShadowRecord:
    """Sums of the measurements of every shadowed step: per layer its noise floor, per (layer, format, scale)
    the errors, per format the overflow sources; and the errors by epoch (`Epochs`), so that a change of the
    numerics during the run shows, and each side of it can be judged on its own."""

    def __init__(self):
        self.steps: list = []                 # the shadowed step numbers (at most MAX_LISTED_STEPS kept)
        self.count = 0
        self.floor: dict = {}                 # layer -> [sum, steps]
        self.sensitivity: dict = {}           # (layer, fmt) -> [sum, turns]
        self.sums: dict = {}                  # (layer, fmt, scale_log2) -> Sums
        self.sources: dict = {}               # fmt -> {layer: steps it overflowed}
        self.unsplit_steps = 0                # steps whose batch could not be halved
        self.turns: dict = {}                 # fmt -> its turns so far
        self.epoch_steps: dict = {}           # fmt -> {epoch: the step of its first turn}
        self.epochs: dict = {}                # (layer, fmt) -> {scale_log2: Epochs of its Sums}

    def turn(self, fmt: str, step: int) -> int:
        """Count a turn of `fmt` at `step`; its epoch (Epochs)."""
        t = self.turns[fmt] = self.turns.get(fmt, 0) + 1
        epoch = t.bit_length() - 1
        self.epoch_steps.setdefault(fmt, {}).setdefault(epoch, step)
        return epoch

    def add(self, layer: str, fmt: str, scale: int, measured: dict, epoch: int) -> None:
        self.sums.setdefault((layer, fmt, scale), Sums()).add(measured)
        self.epochs.setdefault((layer, fmt), {}).setdefault(scale, Epochs()).add(epoch, measured)

    def mean_floor(self, layer: str):
        """The layer's noise floor, mean over the steps that measured it (None: none did)."""
        total, n = self.floor.get(layer, (0.0, 0))
        return total / n if n else None

    def mean_sensitivity(self, layer: str, fmt: str):
        """The layer's weight sensitivity at the format's precision, mean over the turns that measured it (None:
        none did)."""
        total, n = self.sensitivity.get((layer, fmt), (0.0, 0))
        return total / n if n else None

    def windows(self, layer: str, fmt: str) -> list:
        """[{"from_step", "early", "late", "by_scale"}, ...]: the means at scale 1 of the shadowed steps before
        and from the first step of each epoch of the format, for every epoch that leaves MIN_WINDOW_TURNS turns on
        each side, and both sides' means at every scale ({"early"/"late": {scale_log2: means}})."""
        scales = self.epochs.get((layer, fmt), {})
        if 0 not in scales:
            return []
        out = []
        for boundary, step in sorted(self.epoch_steps[fmt].items()):
            early, late = scales[0].split(boundary)
            if min(early.steps, late.steps) >= MIN_WINDOW_TURNS:
                sides = {scale: e.split(boundary) for scale, e in scales.items()}
                out.append({"from_step": step, "early": early.means(), "late": late.means(),
                            "by_scale": {side: {scale: parts[i].means() for scale, parts in sides.items()
                                                if parts[i].steps}
                                         for i, side in enumerate(("early", "late"))}})
        return out

    def to_dict(self) -> dict:
        """{"steps", "layers": {layer: {"noise_floor", "formats": {fmt: {scale_log2: means}}, "windows": {fmt:
        windows}, "sensitivity": {fmt: mean}}}, "overflow_sources": {fmt: {layer: steps}}, "unsplit_steps"}."""
        layers: dict = {}
        for (layer, fmt, scale), sums in self.sums.items():
            entry = layers.setdefault(layer, {"noise_floor": None, "formats": {}, "windows": {}, "sensitivity": {}})
            entry["formats"].setdefault(fmt, {})[scale] = sums.means()
            if scale == 0:
                entry["windows"][fmt] = self.windows(layer, fmt)
                if (layer, fmt) in self.sensitivity:
                    entry["sensitivity"][fmt] = self.mean_sensitivity(layer, fmt)
        for layer in layers:
            layers[layer]["noise_floor"] = self.mean_floor(layer)
        return {"shadowed_steps": self.count, "steps": list(self.steps), "layers": layers,
                "overflow_sources": {f: dict(s) for f, s in self.sources.items()},
                "unsplit_steps": self.unsplit_steps}


MAX_LISTED_STEPS = 64


def check_shadow_options(scales, numerics) -> tuple:
    """shadow_scales (None: NARROW_SCALES_LOG2) as sorted distinct ints, after checking them and shadow_numerics:
    ValueError naming the value and what is allowed."""
    if numerics not in NUMERICS:
        raise ValueError(f"shadow_numerics must be one of {', '.join(map(repr, NUMERICS))}, got {numerics!r}")
    if scales is None:
        return NARROW_SCALES_LOG2
    try:
        given = list(scales)
    except TypeError:
        given = [scales]
    if any(isinstance(s, bool) or not isinstance(s, numbers.Integral) for s in given):
        raise ValueError(f"shadow_scales must be ints (log2 of the candidate loss scales), got {scales!r}")
    values = tuple(sorted({int(s) for s in given}))
    if not values or values[0] != 0 or values[-1] > 64:
        raise ValueError(f"shadow_scales must hold 0 (scale 1) and ints up to 64, got {scales!r}")
    return values


@dataclasses.dataclass
class _Capture:
    step: int
    args: tuple
    kwargs: dict
    buffers: dict
    state: "_RunState"           # the RNG streams and module attributes as the real forward began
    grads: list = dataclasses.field(default_factory=list)   # per output leaf: float32 gradient or None
    handles: list = dataclasses.field(default_factory=list)
    versions: list = dataclasses.field(default_factory=list)   # the root's parameters as its forward used them
    real: dict | None = dataclasses.field(default_factory=dict)   # parameter name -> the real backward's
    # gradient; None when the step ran the model more than once (gradient accumulation: they would be summed)


class ShadowSteps:
    """Capture and replay for one watched run. `attach(core, ...)` hooks the root model; the watcher calls
    `before_step(inverse_scale)` from its optimizer pre-step hook and `step_ended()` at the end of each step."""

    def __init__(self, limits, every: int, scales=None, numerics: str = "emulated"):
        scales = check_shadow_options(scales, numerics)
        self.numerics = numerics
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"shadow_every must be a positive int (replay every N-th step) or None, got {every!r}")
        self.every, self.scales = every, scales
        self.formats = [lim for lim in limits if lim.per_tensor_scaled or lim.name in AUTOCAST_DTYPES]
        self.skipped_formats = [lim.name for lim in limits if lim not in self.formats]
        self.dropped_formats: dict = {}   # format name -> the error its replay raised (then taken out of the turns)
        self.record = ShadowRecord()
        self.core = None
        self.may_retarget = False             # until the root's forward first runs (`retarget`)
        self._outermost = None                # the first module that ran outermost while it may (`retarget`)
        self.notes: list = []
        self.error = None
        self._capture = None
        self._handles: list = []
        self._busy = None
        self._step_of = None
        self._name_of = None
        self._groups: list = []               # [(layer name, [parameter names])]
        self._module_names: dict = {}         # id(module) -> qualified name in core
        self._layer_names: dict = {}          # id(module) -> the watcher's record name
        self._escalated: set = set()          # formats whose other candidate scales are replayed
        self._standing_out: dict = {}         # format -> its turns with a layer standing out at scale 1
        self._turn = 0                        # position in the rotation: the noise floor, then each format
        self._compute = None                  # the emulated replays' FP32Compute mode (its caches kept)
        self._real_matches = None             # whether the real gradients matched the last reference replay
        self._format_turns = 0
        self._unreached: set = set()          # parameters the last reference replay gave no gradient (a
                                              #   reentrant checkpoint recomputes with the module's own ones)
        self._replaying = False               # the replays' own forwards are not captured
        self._replayed_step = None            # one replay per step (a closure may run the forward again)
        self.halving_error = None             # why a replay of half the batch failed (then no more halves)
        self._exact_turns: dict = {}          # format -> its turns whose gradients equalled the reference exactly
        self._unquantised_turns: dict = {}    # format (per-tensor scaled) -> its turns that quantised no product
        self.upcast: set = set()              # the dtypes of the model's parameters that were replayed in FP32
        self.kept_dtypes: set = set()         # those of parameters beside FP32 ones, replayed in their own dtype

    @property
    def numerics(self) -> str:
        """How FP16/BF16 are replayed: "emulated" (default) or "autocast" (NUMERICS)."""
        return self._numerics

    @numerics.setter
    def numerics(self, value: str) -> None:
        if value not in NUMERICS:
            raise ValueError(f"shadow numerics must be one of {', '.join(map(repr, NUMERICS))}, got {value!r}")
        self._numerics = value

    # ------------------------------------------------------------ life cycle
    @property
    def wants_root(self) -> bool:
        return self.core is None and self.error is None and not self.notes

    def attach(self, model, core, name_of, busy, step_of) -> None:
        """Hook `core` (the unwrapped root `model`). name_of(module): the watcher's record name or None."""
        import torch

        if not self.wants_root:
            return
        if isinstance(core, torch.jit.ScriptModule):
            self.notes.append(f"{name_of(model) or type(core).__name__} is TorchScript: no shadow steps "
                              f"(verdicts from value counts)")
            return
        if self._refuses_subclasses(core.parameters(), name_of(model) or type(core).__name__):
            return
        self._busy, self._step_of, self._name_of = busy, step_of, name_of
        self._hook(core)
        if type(model).__name__ == "OptimizedModule":
            self.compiled(model)
        self.may_retarget = True

    def compiled(self, wrapper) -> None:
        """`wrapper`, torch.compile's module around the root, calls it: capture at its call too. Inside compiled
        code the root's own hooks do nothing (torch.compiler.is_compiling), the wrapper's run as the run calls
        it; the replays call the root itself, eagerly (run_eagerly)."""
        if self.core is not None and wrapper is not self.core:
            self._handles += _hook_calls(wrapper, self._on_forward_pre, self._on_forward)

    def ran_outermost(self, module) -> None:
        """`module` ran outermost with gradients on while the root's own forward has not run yet this run: the
        first such module of the step with parameters of the root is the candidate for `retarget`."""
        if self._outermost is None and id(module) in self._module_names and module is not self.core \
                and any(True for _ in module.parameters()):
            self._outermost = module

    def step_ended(self) -> None:
        """The run's step ended: drop a capture not replayed, unless it still waits for its gradient with the
        root's parameters as its forward used them (a GAN's generator: its forward runs in the discriminator's
        step, its backward in the next, where it is replayed); where a step went by without the root's own
        forward, retarget."""
        capture = self._capture
        if capture is None or any(g is not None for g in capture.grads) or not capture.handles \
                or _versions(self.core) != capture.versions:
            self.forget()
        if self.may_retarget and self._outermost is not None:
            self.retarget(self._outermost)

    def retarget(self, module) -> None:
        """A whole step ran without the root's own forward, and `module`, one of its modules with parameters, ran
        outermost (a LightningModule whose training_step calls self.net(x)): capture and replay `module`
        instead, from the next shadowed step. The root's parameters outside it get no shadow evidence."""
        self.may_retarget, self._outermost = False, None
        for handle in self._handles:
            handle.remove()
        self.forget()
        self._groups, self._module_names, self._layer_names = [], {}, {}
        self._hook(module)

    def _hook(self, core) -> None:
        self.core = core
        seen = set()
        for qual, module in core.named_modules():
            self._module_names[id(module)] = qual
            names = []
            for pname, p in module.named_parameters(recurse=False):
                if id(p) in seen or not p.requires_grad:
                    continue
                seen.add(id(p))
                names.append(f"{qual}.{pname}" if qual else pname)
            self._layer_names[id(module)] = self._name_of(module) or qual or type(core).__name__
            if names:
                self._groups.append((self._layer_names[id(module)], names))
        self._handles = _hook_calls(core, self._on_forward_pre, self._on_forward)

    def describe(self) -> list:
        """Notes for the report: what the shadow steps could not do."""
        out = list(self.notes)
        if self.error is not None:
            out.append(f"shadow steps stopped after an error: {self.error}")
        if not self.record.count and self.error is None and not self.notes:
            out.append("no step was shadowed (no forward of the model with gradients and a backward through its "
                       "outputs on a shadowed step): verdicts from value counts")
        if self.skipped_formats:
            out.append(f"no shadow steps for {', '.join(self.skipped_formats)} (autocast runs fp16 and bf16; "
                       f"per-tensor scaling is for formats of 8 bits or fewer): value counts only")
        for name, error in self.dropped_formats.items():
            out.append(f"shadow steps for {name} stopped after its replay failed ({error}): its later verdicts from "
                       f"the steps before, or value counts")
        unquantised = [name for name, n in self._unquantised_turns.items() if n == self.record.turns.get(name)]
        if unquantised:
            out.append(f"no {' and no '.join(unquantised)} replay found a layer's matrix product to fake-quantise "
                       f"(F.linear, a convolution, or a product with a parameter): the model's products run inside "
                       f"fused kernels (an RNN's), so those shadow steps measured nothing: verdicts from value counts")
        if self.overridden:
            out.append(f"every {' and every '.join(self.overridden)} replay gave exactly the reference's gradients: "
                       f"the model's forward sets its own precision (an autocast inside it) over the replays', so "
                       f"the reference is not FP32 and the shadow steps show no format: verdicts from value counts")
        if self.upcast:
            out.append(f"the model's parameters are {' and '.join(sorted(self.upcast))}: the shadow steps replay it "
                       f"with parameters, inputs and buffers in FP32 (the reference, and each format as a "
                       f"mixed-precision run of the same model computes it), not in the run's own arithmetic")
        if self.kept_dtypes:
            out.append(f"the model mixes {' and '.join(sorted(self.kept_dtypes))} parameters with float32 ones: the "
                       f"shadow steps replay it in its own dtypes (the FP32 reference computes those parameters' "
                       f"layers as the run does)")
        if self.halving_error is not None:
            out.append(f"the replay of half a batch failed ({self.halving_error}; the model keeps state shaped by the "
                       f"full batch?): no noise floor from {self.record.unsplit_steps} shadowed steps, the formats "
                       f"were replayed on the whole batch")
        elif self.record.unsplit_steps:
            out.append(f"{self.record.unsplit_steps} shadowed steps had a batch that cannot be halved (one sample, "
                       f"or outputs not batched along dim 0): no noise floor from them")
        return out

    @property
    def overridden(self) -> list:
        """Formats every replay of which gave exactly the reference's gradients, on every layer: no rounding
        shows, so the model's forward set its own precision over the replays' (an autocast inside it), and
        the reference ran in it too."""
        return [name for name, n in self._exact_turns.items() if n == self.record.turns.get(name)]

    def evidence(self) -> dict:
        """What the shadow steps measured (ShadowRecord.to_dict) and how they ran."""
        return {"every": self.every, "scales_log2": list(self.scales), "numerics": self.numerics,
                "formats": [lim.name for lim in self.formats], **self.record.to_dict()}

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.forget()

    def forget(self) -> None:
        """Drop a capture that was not replayed (the step ended without an optimizer step of ours)."""
        if self._capture is not None:
            for handle in self._capture.handles:
                handle.remove()
        self._capture = None

    def _fail(self, err: BaseException) -> None:
        self.error = f"{type(err).__name__}: {err}"
        warnings.warn(f"fpsim.watch: shadow steps stopped after an error ({self.error}); observation and "
                      f"training continue", RuntimeWarning, stacklevel=3)
        self.close()

    # -------------------------------------------------------------- capture
    def _on_forward_pre(self, module, args, kwargs):
        import torch

        if torch.compiler.is_compiling():    # the root's hooks inside compiled code: nothing, no guard
            return None
        self.may_retarget, self._outermost = False, None
        step = self._step_of()
        capture = self._capture
        if capture is not None and capture.handles and not any(g is not None for g in capture.grads) \
                and not self._replaying and torch.is_grad_enabled():
            self.forget()   # no gradient reached the last forward before this one (an evaluation forward with
            capture = None  # gradients on, outputs of several forwards joined in one loss): capture this one
        if capture is not None or self._replaying or step % self.every or step == self._replayed_step \
                or not torch.is_grad_enabled():
            return None
        try:
            with self._busy():
                args, kwargs = _fresh(tuple(args)), _fresh(dict(kwargs))
                self._capture = _Capture(step, args, kwargs,
                                         {n: b.detach().clone() for n, b in self.core.named_buffers()},
                                         _RunState(self.core, (args, kwargs)), versions=_versions(self.core))
        except Exception as err:
            self._fail(err)
        return None

    def _on_forward(self, module, args, kwargs, output):
        import torch

        if torch.compiler.is_compiling():
            return None
        capture = self._capture
        if capture is None or self._replaying:
            return None                              # not shadowed, or a replay's forward
        if capture.grads or capture.handles:         # a later forward of the same step
            capture.real = None
            return None
        try:
            outputs = float_tensors(output)
            capture.grads = [None] * len(outputs)
            for i, t in enumerate(outputs):
                if t.requires_grad:
                    capture.handles.append(t.register_hook(self._grad_hook(capture, i)))
            if not capture.handles:
                self.forget()
                return None
            if self._real_matches is not False:
                for name, p in self.core.named_parameters():
                    if p.requires_grad:
                        capture.handles.append(p.register_hook(self._param_hook(capture, name)))
        except Exception as err:
            self._fail(err)
        return None

    def _grad_hook(self, capture, i):
        def on_grad(grad):
            try:
                with self._busy():
                    g = widened(grad.detach()).clone()
                    capture.grads[i] = g if capture.grads[i] is None else capture.grads[i] + g
            except Exception as err:
                self._fail(err)
        return on_grad

    def _param_hook(self, capture, name):
        def on_grad(grad):
            try:
                with self._busy():
                    if capture.real is not None:
                        g = widened(grad.detach()).clone()
                        capture.real[name] = g if name not in capture.real else capture.real[name] + g
            except Exception as err:
                self._fail(err)
        return on_grad

    # --------------------------------------------------------------- replay
    def before_step(self, inverse_scale=None) -> None:
        """Replay the captured step, if one is complete (the parameters are still those of its forward)."""
        capture = self._capture
        if capture is None or not any(g is not None for g in capture.grads):
            return
        self.forget()
        self._replayed_step = capture.step
        try:
            with self._busy():
                if inverse_scale is not None:   # a GradScaler'd backward: judge the gradients unscaled
                    capture.grads = [None if g is None else g * inverse_scale.to(g.device) for g in capture.grads]
                    if capture.real is not None:
                        capture.real = {n: g * inverse_scale.to(g.device) for n, g in capture.real.items()}
                self._replay(capture)
        except Exception as err:
            self._fail(err)

    def _refuses_subclasses(self, parameters, label: str) -> bool:
        """Whether the root's `parameters` hold tensor subclasses (DTensor: FSDP2's fully_shard, tensor
        parallelism), which no shadow step replays: a replay copies the parameters and calls the forward on the
        copies while the watcher's work runs with Python dispatch off, where a subclass's own operations cannot
        run (a DTensor's copy crashed the process), and a sharded forward gathers its parameters with
        collectives of its own. Then a note says so and the shadow steps stop."""
        kinds = sorted({type(p).__name__ for p in parameters if is_subclass(p)})
        if not kinds:
            return False
        self.notes.append(f"{label} holds parameters that are tensor subclasses ({', '.join(kinds)}): no shadow steps "
                          f"(verdicts from value counts)")
        self.close()
        return True

    def _replay(self, capture) -> None:
        import torch

        named = list(self.core.named_parameters())
        if self._refuses_subclasses((p for _, p in named), self._name_of(self.core) or type(self.core).__name__):
            return                     # (sharded after watch began)
        others = {str(p.dtype).removeprefix("torch.") for _, p in named if _recast(p.dtype)}
        # a model wholly in FP16/BF16 (pure low-precision training) or FP64 (which autocast leaves as it is) is
        # replayed in FP32, as for AMP; one that mixes them with FP32 parameters (a frozen BF16 part beside FP32
        # layers, cast to by its own forward) in its own dtypes
        whole = bool(others) and all(_recast(p.dtype) for _, p in named if p.is_floating_point())
        params = {n: _copy(p, whole).requires_grad_(True) for n, p in named if p.requires_grad}
        if not params:
            return
        if whole:
            self.upcast |= others
            capture = _upcast(capture, {n: p.detach().float() for n, p in named if not p.requires_grad})
        else:
            self.kept_dtypes |= others
        device = next(iter(params.values())).device.type
        real = _RunState(self.core, (capture.args, capture.kwargs))
        self._replaying = True
        try:
            with torch.enable_grad(), run_eagerly(), _unchecked_reentrant_checkpoints():
                self._measure(capture, params, device)
        finally:
            self._replaying = False
            real.restore()
        rec = self.record
        rec.count += 1
        if len(rec.steps) < MAX_LISTED_STEPS:
            rec.steps.append(capture.step)

    def _measure(self, capture, params, device) -> None:
        """This step's turn of the rotation (module doc): the noise floor, or one format against the FP32 reference."""
        tasks = [None, *self.formats]             # None: the noise floor
        task = tasks[self._turn % len(tasks)]
        self._turn += 1
        halving_error = None
        if task is None:
            try:
                split = self._noise_floor(capture, params, device)
            except Exception as err:   # state kept for the full batch (a tensor of last step's batch size)?
                halving_error, split = err, False
            if split or len(tasks) == 1:
                return
            task = tasks[self._turn % len(tasks)]  # a batch that cannot be halved: this step replays a format
            self._turn += 1
        reference = self._reference(capture, params, device)
        if halving_error is not None:  # (the whole batch replays: the halves were the trouble)
            self.halving_error = f"{type(halving_error).__name__}: {halving_error}"
            self.record.unsplit_steps += 1
        try:
            self._replay_format(task, capture, params, device, Reference(reference, self._groups))
        except Exception as err:      # this format cannot be replayed here (torch's CPU LSTM has no fp16 kernel)
            self._drop_format(task, err)

    def _drop_format(self, lim, err: Exception) -> None:
        """Take `lim` out of the rotation after its replay failed, with a warning: the other formats go on."""
        self.formats.remove(lim)
        self.dropped_formats[lim.name] = f"{type(err).__name__}: {err}"
        warnings.warn(f"fpsim.watch: no more shadow steps for {lim.name} ({self.dropped_formats[lim.name]}); the "
                      f"other formats and training continue", RuntimeWarning, stacklevel=4)

    def _reference(self, capture, params, device) -> dict:
        """The FP32 gradients of the captured step: the real backward's where they matched the last reference
        replay (a plain FP32 run with one backward per step), else, and every RECHECK_EVERY-th format turn, a
        replay (which checks the match again: an AMP run's, an accumulated or a regularised step's differ)."""
        self._format_turns += 1
        if capture.real is not None and self._real_matches and self._format_turns % RECHECK_EVERY:
            return {name: g for name, g in capture.real.items() if name not in self._unreached}
        replayed = self._backward(capture, params, FP32(device), (0,))[0]
        self._unreached = {name for name, g in replayed.items() if g is None}   # not measured: no replay reaches
        if capture.real is not None and self._real_matches is not False:
            self._real_matches = _matches(capture.real, replayed)
        return replayed

    def _replay_format(self, lim, capture, params, device, ref) -> None:
        """Replay the step in `lim` (again with the overflow sources found kept in FP32) and add its errors to the record."""
        import torch

        keep, sources = set(), {}
        scales = self.scales if not lim.per_tensor_scaled and lim.emax < 127 else (0,)
        for attempt in range(MAX_OVERFLOW_PASSES):
            found: dict = {}
            if lim.per_tensor_scaled:
                context = FakeQuant(self.core, self._module_names, lim, keep, found)
            elif self.numerics == "emulated":
                if self._compute is None:
                    from ..emulate.compute import FP32Compute

                    self._compute = FP32Compute()
                context = EmulatedAutocast(self.core, self._module_names, device,
                                           getattr(torch, AUTOCAST_DTYPES[lim.name]), keep, found, self._compute)
            else:
                context = Autocast(self.core, self._module_names, device, getattr(torch, AUTOCAST_DTYPES[lim.name]),
                                   keep, found)
            last = attempt == MAX_OVERFLOW_PASSES - 1
            context.stop_at_source = not last
            at1: dict = {}           # the scale-1 measurements, made once for _escalate and the record

            def escalate(result, at1=at1):
                at1.update(ref.compare(result))
                return self._escalate(lim, at1)

            grads = self._backward(capture, params, context, scales, stop=None if last else lambda: bool(found),
                                   escalate=escalate)
            if not found:
                break
            sources.update(found)
            keep |= set(found.values())
        for q, module in sources.items():
            layer = self._layer_names.get(id(module), q or type(self.core).__name__)
            by_layer = self.record.sources.setdefault(lim.name, {})
            by_layer[layer] = by_layer.get(layer, 0) + 1
        epoch = self.record.turn(lim.name, capture.step)
        if lim.per_tensor_scaled and not context.products:   # nothing was rounded: nothing to measure
            self._unquantised_turns[lim.name] = self._unquantised_turns.get(lim.name, 0) + 1
            return
        for scale, result in (grads or {}).items():
            by_layer = at1 if scale == 0 and at1 else ref.compare(result)
            if scale == 0:
                at1 = by_layer
            for name, _ in self._groups:
                if name in by_layer:
                    self.record.add(name, lim.name, scale, by_layer[name], epoch)
        if at1 and all(m is not None and m["rel_error"] == 0 and not m["nonfinite_share"] for m in at1.values()):
            self._exact_turns[lim.name] = self._exact_turns.get(lim.name, 0) + 1
        if any(m is not None and not m["nonfinite_share"] and m["rel_error"] > threshold(self.record.mean_floor(name))
               for name, m in at1.items()):
            turns = self._standing_out[lim.name] = self._standing_out.get(lim.name, 0) + 1
            if turns % RECHECK_EVERY == 1:     # the first such turn, then every RECHECK_EVERY-th: it varies slowly
                self._sensitivity(lim, capture, params, device, ref)

    def _sensitivity(self, lim, capture, params, device, ref) -> None:
        """Sum each layer's weight sensitivity at `lim`'s precision into the record: the relative change of its
        FP32 gradient when every parameter moves by a random share of up to one unit roundoff of the format
        (2^-(man_bits+1)), as rounding the weights to it does. An error no larger is backward-stable: the
        low-precision step is an FP32 step of weights the format cannot tell apart (evidence.threshold)."""
        import torch

        unit = math.ldexp(1.0, -(lim.fmt.man_bits + 1))
        generators: dict = {}          # streams of their own, seeded by the step: the run's are untouched

        def share(p):
            g = generators.get(p.device)
            if g is None:
                g = generators[p.device] = torch.Generator(device=p.device).manual_seed(capture.step)
            return 2 * torch.rand(p.shape, generator=g, device=p.device) - 1

        moved = {n: (p * (1 + unit * share(p)).to(p.dtype)).detach().requires_grad_(True)
                 for n, p in params.items()}
        by_layer = ref.compare(self._backward(capture, moved, FP32(device), (0,))[0])
        for name, _ in self._groups:
            m = by_layer.get(name)
            if m is not None and not m["nonfinite_share"]:
                entry = self.record.sensitivity.setdefault((name, lim.name), [0.0, 0])
                entry[0] += m["rel_error"]
                entry[1] += 1

    def _escalate(self, lim, at1: dict) -> bool:
        """Whether to replay the other candidate scales (at1: each layer's measurements at scale 1): from the
        first step where a layer stands out at scale 1 (against its mean noise floor so far) on, always (so
        that their means cover every step since)."""
        if lim.name not in self._escalated:
            for name, _ in self._groups:
                m = at1.get(name)
                if m is not None and (m["nonfinite_share"] or m["rel_error"] > threshold(self.record.mean_floor(name))):
                    self._escalated.add(lim.name)
                    break
        return lim.name in self._escalated

    def _noise_floor(self, capture, params, device) -> bool:
        """Sum each layer's ||gA - gB|| / ||gA + gB|| of this step's halves into the record; False when the
        batch cannot be halved (or a replay of a half failed before: not tried again)."""
        halves = None if self.halving_error is not None else _halves(capture)
        if halves is None:
            self.record.unsplit_steps += 1
            return False
        parts = [self._backward(h, params, FP32(device), (0,))[0] for h in halves]
        for name, names in self._groups:
            ga, gb = flat(parts[0], names), flat(parts[1], names)
            if ga is None or gb is None:
                continue
            total = float((ga + gb).norm())
            if total:
                entry = self.record.floor.setdefault(name, [0.0, 0])
                entry[0] += float((ga - gb).norm()) / total
                entry[1] += 1
        return True

    def _backward(self, capture, params, context, scales, stop=None, escalate=None) -> dict | None:
        """{scale_log2: {parameter name: float32 gradient or None}} of the captured step replayed under `context`.

        stop(): checked after the forward; True: no backward, None back (an overflow source was found: the
        caller replays with it in FP32), as when the forward raised SourceFound (the context stops at its first
        source). escalate(gradients at scale 1): whether to go on to the other scales.
        """
        import torch
        from torch.func import functional_call

        capture.state.restore()         # each replayed forward starts where the real one did, on fresh copies
        _without_amp_wrapper(self.core)
        buffers = {n: b.clone() for n, b in capture.buffers.items()}   # of its inputs (a forward may write them)
        with context.arithmetic():
            try:
                with context:
                    out = functional_call(self.core, {**context.parameters(params), **buffers},
                                          _fresh(capture.args), _fresh(capture.kwargs))
            except SourceFound:
                return None
            if stop is not None and stop():
                return None
            pairs = [(o, g) for o, g in zip(float_tensors(out), capture.grads) if g is not None and o.requires_grad]
            names = list(params)
            result = {}
            for i, s in enumerate(scales):
                factor = math.ldexp(1.0, s)
                grads = torch.autograd.grad([o for o, _ in pairs], [params[n] for n in names],
                                            [(g * factor).to(o.dtype) for o, g in pairs],
                                            retain_graph=i < len(scales) - 1, allow_unused=True)
                result[s] = {n: None if g is None else widened(g) / factor if s else widened(g)
                             for n, g in zip(names, grads)}
                if i == 0 and len(scales) > 1 and (escalate is None or not escalate(result[s])):
                    break
        return result


# ------------------------------------------------------------------ helpers
class _RunState:
    """What a forward reads and changes besides its parameters and buffers, to set back: the RNG streams
    (torch's, CUDA's once initialised, Python's random, numpy's global one, and every torch.Generator among
    the inputs or the modules' attributes) and the bindings of the modules' attributes (a tensor kept from
    the last forward, a call counter). An object an attribute holds and a forward changes in place (a list
    appended to) is not copied."""

    def __init__(self, core, inputs):
        import random

        import numpy as np
        import torch

        self.torch_rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() \
            else None
        self.python_rng, self.numpy_rng = random.getstate(), np.random.get_state()
        self.attributes = [(m, dict(vars(m))) for m in core.modules()]
        generators = {id(g): g for g in leaves(inputs) if isinstance(g, torch.Generator)}
        generators.update((id(v), v) for _, names in self.attributes for v in names.values()
                          if isinstance(v, torch.Generator))
        self.generators = [(g, g.get_state()) for g in generators.values()]

    def restore(self) -> None:
        import random

        import numpy as np
        import torch

        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        np.random.set_state(self.numpy_rng)
        for generator, state in self.generators:
            generator.set_state(state)
        for module, before in self.attributes:
            now = vars(module)
            for name in [name for name in now if name not in before]:
                del now[name]
            for name, value in before.items():
                if now.get(name, _ABSENT) is not value:
                    now[name] = value


_ABSENT = object()


def _without_amp_wrapper(core) -> None:
    """Each replay computes in its own precision: a forward that accelerate wrapped in autocast (transformers'
    Trainer with bf16=True or fp16=True) would run every replay in the run's dtype, the FP32 reference included,
    so the replays call the forward as it was before the wrapping (as accelerate's unwrap_model does). The
    run's binding comes back with the rest of its module attributes (_RunState.restore)."""
    own = vars(core)
    if own.get("_original_forward") is not None and "forward" in own:
        own["forward"] = own["_original_forward"]


@contextlib.contextmanager
def _unchecked_reentrant_checkpoints():
    """A context in which a reentrant torch.utils.checkpoint runs its segment as a plain call. The replays ask
    torch.autograd.grad for the parameters' gradients, which a reentrant checkpoint refuses (it recomputes in
    backward, outside the replay's parameters); recomputing gives the same values, so the plain call is the
    same step. Non-reentrant checkpoints (torch's default) replay as they are."""
    from torch.utils.checkpoint import CheckpointFunction

    def plain(cls, function, preserve_rng_state, *args):
        return function(*args)

    own = CheckpointFunction.__dict__.get("apply")       # (None: it inherits torch.autograd.Function's)
    CheckpointFunction.apply = classmethod(plain)
    try:
        yield
    finally:
        if own is None:
            del CheckpointFunction.apply
        else:
            CheckpointFunction.apply = own


def _recast(dtype) -> bool:
    """Whether the replays compute a tensor of this dtype in float32: float16/bfloat16 (a model trained in pure
    low precision) and float64 (which torch.autocast leaves as it is: no format would show)."""
    import torch

    return dtype == torch.float64 or is_low_precision(dtype)


def _copy(t, recast: bool):
    """A detached copy of a parameter, float16/bfloat16/float64 ones cast to float32 where `recast`: a forward
    that writes into its parameters (Embedding(max_norm=...) renormalises rows in place) writes into the
    replay's copy, never into the run's parameters."""
    return t.detach().float() if recast and _recast(t.dtype) else t.detach().clone()


def _hook_calls(module, before, after) -> list:
    """Forward pre- and post-hooks (with kwargs) on the user's `module`, as ModuleHooks; their handles."""
    return [module.register_forward_pre_hook(ModuleHook(before), with_kwargs=True),
            module.register_forward_hook(ModuleHook(after), with_kwargs=True)]


def _versions(core) -> list:
    """Each parameter of `core` with its version: an update in place, or a parameter replaced, changes it."""
    return [(id(p), p._version) for p in core.parameters()]


def _fresh(tree):
    """`tree` with every tensor copied, detached (an input that requires grad keeps it: reentrant checkpointing
    needs one)."""
    import torch

    return map_leaves(lambda x: x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor)
                      else x, tree)


def _upcast(capture, frozen: dict):
    """The capture with its float16/bfloat16/float64 inputs and buffers in float32 (gradient flags kept), and
    `frozen` (parameters that train not, in float32) among its buffers."""
    import torch

    def up(x):
        if isinstance(x, torch.Tensor) and _recast(x.dtype):
            return x.detach().float().requires_grad_(x.requires_grad)
        return x

    buffers = {n: up(b) for n, b in capture.buffers.items()}
    buffers.update(frozen)
    return dataclasses.replace(capture, args=map_leaves(up, capture.args), kwargs=map_leaves(up, capture.kwargs),
                               buffers=buffers)


def _halves(capture):
    """Two captures, each with half of the batch (dim 0 of the first tensor input), or None when the batch
    cannot be halved: fewer than 2 samples, or an output gradient that is neither batched nor a scalar."""
    import torch

    tensors = [t for t in leaves((capture.args, capture.kwargs)) if isinstance(t, torch.Tensor) and t.ndim]
    if not tensors or tensors[0].shape[0] < 2:
        return None
    batch = tensors[0].shape[0]
    if any(g is not None and g.ndim and g.shape[0] != batch for g in capture.grads):
        return None
    half = batch // 2
    out = []
    for part in (slice(0, half), slice(half, batch)):
        def cut(x, part=part):
            return x[part] if isinstance(x, torch.Tensor) and x.ndim and x.shape[0] == batch else x
        grads = [None if g is None else (g[part] if g.ndim else g) for g in capture.grads]
        out.append(dataclasses.replace(capture, args=map_leaves(cut, capture.args),
                                       kwargs=map_leaves(cut, capture.kwargs), grads=grads, handles=[]))
    return out


def _matches(real: dict, replayed: dict) -> bool:
    """Every parameter the replay gave a gradient has a real one within MATCH_TOLERANCE of it."""
    for name, g in replayed.items():
        r = real.get(name)
        if g is None:
            continue
        if r is None or r.shape != g.shape or float((r - g).norm()) > MATCH_TOLERANCE * float(g.norm()):
            return False
    return True
