"""The precision a run really uses: autocast per op (from the dtypes the ops ran in) and every GradScaler.

While a watch runs, `torch.amp.GradScaler.scale`, `unscale_`, `step` and
`update` are wrapped (on the class, so every scaler and subclass is seen; once
for all open watches, and put back when the last one closes, in whatever order
they close); the scaler's own arithmetic is not counted. `scale()` tells the
watch that this step's backward tensors are multiplied by the scaler's scale (a
device tensor: the watch divides by it when counting, with no host read);
`update()` records the scale the step used and whether the scaler skipped it
(found Inf/NaN), read after GradScaler.step has already synchronised on the
same flags.
"""

from __future__ import annotations

import contextlib
import weakref

MAX_RECORDED_STEPS = 10000
"""Scale changes and skipped steps listed per scaler (the counts cover every step)."""


class ScalerRecord:
    """What one real GradScaler did: the scale at each change, the steps it skipped."""

    def __init__(self, label: str):
        self.label = label
        self.steps = 0
        self.skipped = 0
        self.skipped_steps: list = []
        self.trajectory: list = []   # [step, scale] at the first step and at every change
        self.growth_interval = None
        self.backoff_factor = None
        self.growth_factor = None

    def record(self, step: int, scale: float, skipped: bool) -> None:
        self.steps += 1
        if skipped:
            self.skipped += 1
            if len(self.skipped_steps) < MAX_RECORDED_STEPS:
                self.skipped_steps.append(step)
        if (not self.trajectory or self.trajectory[-1][1] != scale) and len(self.trajectory) < MAX_RECORDED_STEPS:
            self.trajectory.append([step, scale])

    def to_dict(self) -> dict:
        import math

        scales = [s for _, s in self.trajectory]
        return {"name": self.label, "steps": self.steps, "skipped_steps": self.skipped,
                "skipped": list(self.skipped_steps), "trajectory": [list(t) for t in self.trajectory],
                "first_scale": scales[0] if scales else None, "last_scale": scales[-1] if scales else None,
                "last_scale_log2": math.log2(scales[-1]) if scales and scales[-1] > 0 else None,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval}


class ScalerWatch:
    """GradScaler's methods observed for one watcher, from its creation until `restore()`.

    The wrappers on the class are installed once, whatever the number of watches open, and hand every call
    to each open watch; the last watch to restore puts torch's own methods back, in whatever order the
    watches close (two framework callbacks close in the order they were opened).
    """

    def __init__(self, watcher):
        self._watcher = weakref.ref(watcher)
        self.records: dict = {}          # id(scaler) -> ScalerRecord
        self._refs: dict = {}            # id(scaler) -> weakref (ids of dead scalers are not reused for them)
        _WATCHES.append(self)
        _install()

    def observe_update(self, watcher, scaler) -> None:
        """Tell `watcher` the scale this step used and whether the scaler skipped it (what update() is about to
        act on); also called for a step whose update() will not run (the run stopped after its optimizer step)."""
        if not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
            return
        try:
            used = float(scaler._scale.item())
            found = sum(float(v.item()) for state in scaler._per_optimizer_states.values()
                        for v in state.get("found_inf_per_device", {}).values())
            watcher._on_scaler_update(self.record_for(scaler), used, found > 0)
        except Exception as err:  # observation only: never break the run
            watcher._fail(err)

    def record_for(self, scaler) -> ScalerRecord:
        key = id(scaler)
        ref = self._refs.get(key)
        if ref is None or ref() is not scaler:
            self._refs[key] = weakref.ref(scaler)
            record = ScalerRecord(f"GradScaler#{len(self.records) + 1}" if self.records else "GradScaler")
            record.growth_factor = scaler.get_growth_factor()
            record.backoff_factor = scaler.get_backoff_factor()
            record.growth_interval = scaler.get_growth_interval()
            self.records[key] = record
        return self.records[key]

    def restore(self) -> None:
        """Stop observing (idempotent); torch's own methods are back once no watch observes."""
        if self in _WATCHES:
            _WATCHES.remove(self)
            if not _WATCHES:
                _uninstall()


_METHODS = ("scale", "unscale_", "step", "update")
_WATCHES: list = []
"""The ScalerWatch of every open watch, in the order they started."""
_ORIGINALS: dict = {}
"""GradScaler's own methods, while fpsim's wrappers are installed (name -> function)."""


def _open_watches() -> list:
    """(ScalerWatch, watcher) of every open watch whose watcher is alive."""
    pairs = [(watch, watch._watcher()) for watch in _WATCHES]
    return [(watch, w) for watch, w in pairs if w is not None]


def _quietly(name: str, scaler, args, kwargs, watches):
    """GradScaler's own method, run with every watch's op observation paused: the scaler's arithmetic is not the
    model's."""
    with contextlib.ExitStack() as stack:
        for _, w in watches:
            stack.enter_context(w._tracer.busy())
        return _ORIGINALS[name](scaler, *args, **kwargs)


def _scale(scaler, *args, **kwargs):
    watches = _open_watches()
    result = _quietly("scale", scaler, args, kwargs, watches)
    if watches and scaler.is_enabled():
        for _, w in watches:
            w._on_scale(scaler)
    return result


def _unscale_(scaler, *args, **kwargs):
    return _quietly("unscale_", scaler, args, kwargs, _open_watches())


def _step(scaler, *args, **kwargs):
    return _quietly("step", scaler, args, kwargs, _open_watches())


def _update(scaler, *args, **kwargs):
    watches = _open_watches()
    for watch, w in watches:
        watch.observe_update(w, scaler)
    return _quietly("update", scaler, args, kwargs, watches)


_WRAPPERS = {"scale": _scale, "unscale_": _unscale_, "step": _step, "update": _update}


def _install() -> None:
    """Put the wrappers on torch.amp.GradScaler (on the class: every scaler and subclass is seen), once."""
    import torch

    if _ORIGINALS:      # installed (or still inside a wrapper someone put over ours: it passes every call on)
        return
    cls = torch.amp.GradScaler
    _ORIGINALS.update({name: cls.__dict__[name] for name in _METHODS})
    for name in _METHODS:
        setattr(cls, name, _WRAPPERS[name])


def _uninstall() -> None:
    """Put torch's own methods back. A method someone wrapped again after fpsim keeps that wrapper, which calls
    fpsim's, which (no watch open) only calls torch's."""
    import torch

    cls = torch.amp.GradScaler
    left = False
    for name in _METHODS:
        if cls.__dict__.get(name) is _WRAPPERS[name]:
            setattr(cls, name, _ORIGINALS[name])
        else:
            left = True
    if not left:
        _ORIGINALS.clear()


def inverse_scale(scaler):
    """1 / the scaler's current scale, as a float32 device tensor (no host read)."""
    return scaler._scale.double().reciprocal().float()


def optimizer_grads_unscaled(scaler, optimizer) -> bool:
    """Whether this scaler has already unscaled the optimizer's gradients this step (GradScaler.unscale_)."""
    state = scaler._per_optimizer_states.get(id(optimizer)) if scaler is not None else None
    return state is not None and getattr(state.get("stage"), "name", "") in ("UNSCALED", "STEPPED")
