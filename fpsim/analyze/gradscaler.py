"""What PyTorch's dynamic GradScaler would do on the observed run.

The simulation replays torch.amp.GradScaler's update rule step by step: a
step is skipped, and the scale multiplied by `backoff_factor`, when any scaled
gradient overflows the format (the largest |gradient| of the step times the
scale rounds beyond max, or the step's gradients hold Inf/NaN already); after
`growth_interval` unskipped steps in a row the scale grows by `growth_factor`
(kept in float32, and only when the result is finite, as torch does).

The per-step gradient amax comes from the watch's bounded per-step array:
steps that were not observed (every=N) reuse the last observed value (the
first observed value before it), and when the array had to merge
neighbouring steps each entry stands for `steps_per_entry` steps with their
largest amax, which can only predict more skips, never fewer.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

MAX_TRAJECTORY = 10000
"""At most this many scale changes are listed (the counts cover every step)."""


@dataclasses.dataclass
class GradScalerPrediction:
    fmt: str
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    steps: int
    skipped_steps: int
    final_scale: float
    min_scale: float
    max_scale: float
    first_unskipped_step: int | None
    trajectory: list
    steps_per_entry: int
    forward_overflows: list = dataclasses.field(default_factory=list)
    """Layers and ops whose forward values overflow the format: the replay, of the gradients, holds for a run
    that keeps them in FP32 (in the format they become Inf, which can make the loss and gradients Inf/NaN)."""

    def to_dict(self) -> dict:
        return {
            "init_scale": self.init_scale, "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
            "steps": self.steps, "skipped_steps": self.skipped_steps, "final_scale": self.final_scale,
            "final_scale_log2": _log2(self.final_scale), "min_scale": self.min_scale, "max_scale": self.max_scale,
            "first_unskipped_step": self.first_unskipped_step,
            "trajectory": [[s, v] for s, v in self.trajectory], "steps_per_entry": self.steps_per_entry,
            "forward_overflows": list(self.forward_overflows),
        }


def _log2(x: float):
    return math.log2(x) if x > 0 and math.isfinite(x) else None


def per_step_amax(step_amax: np.ndarray, steps_per_entry: int, steps: int) -> np.ndarray | None:
    """The gradient amax of every step 0..steps-1 (float64), gaps filled; None if nothing was observed."""
    entries = np.asarray(step_amax, dtype=np.float64)
    observed = ~(entries == -np.inf)
    if steps <= 0 or not observed.any():
        return None
    filled = entries.copy()
    last = entries[np.flatnonzero(observed)[0]]
    for i in range(len(filled)):
        if observed[i]:
            last = filled[i]
        else:
            filled[i] = last
    index = np.minimum(np.arange(steps) // steps_per_entry, len(filled) - 1)
    return filled[index]


def simulate_gradscaler(step_amax: np.ndarray, steps_per_entry: int, steps: int, lim, *,
                        init_scale: float = 2.0**16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                        growth_interval: int = 2000) -> GradScalerPrediction | None:
    """Replay GradScaler(init_scale, growth_factor, backoff_factor, growth_interval) over `steps` steps."""
    amax = per_step_amax(step_amax, steps_per_entry, steps)
    if amax is None:
        return None
    scale = np.float32(init_scale)
    tracker, skipped, first_ok = 0, 0, None
    trajectory = [(0, float(scale))]
    low = high = float(scale)
    for step in range(steps):
        a = amax[step]
        if a != a or math.isinf(a) or lim.overflows(a * float(scale)):
            new = np.float32(scale * np.float32(backoff_factor))
            tracker = 0
            skipped += 1
        else:
            if first_ok is None:
                first_ok = step
            new = scale
            tracker += 1
            if tracker == growth_interval:
                grown = np.float32(scale * np.float32(growth_factor))
                if np.isfinite(grown):
                    new = grown
                tracker = 0
        if new != scale:
            scale = new
            if len(trajectory) < MAX_TRAJECTORY:
                trajectory.append((step + 1, float(scale)))
            low, high = min(low, float(scale)), max(high, float(scale))
    return GradScalerPrediction(lim.name, float(init_scale), growth_factor, backoff_factor, growth_interval,
                                steps, skipped, float(scale), low, high, first_ok, trajectory, steps_per_entry)
