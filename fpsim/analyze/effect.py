"""Effect-weighted statistics: how much of a tensor's norm a format loses, and the error its rounding adds.

A count says how many values a format flushes; these numbers say how much they
mattered. From the log2 histogram and the mass per binade kept beside it (the
sum of |x| and of x^2 over the values of each float32 exponent field, see
histogram.py), for a format and a power-of-two scale 2^s applied before the
cast:

- `mass_lost_l1`, `mass_lost_l2`: the share of sum |x| and of sum x^2 carried
  by the values that flush to zero (the same values `Log2Histogram.underflow`
  counts). sqrt(mass_lost_l2) is the relative L2 error that flushing alone adds.
- `mass_clipped_l1`, `mass_clipped_l2`: the share carried by the values beyond
  the format's overflow threshold (they become Inf, or max when saturating): 0
  when nothing overflows (exact, from the amax), otherwise an upper bound that
  includes the whole binade holding the threshold.
- `rounding_rel_error`: the relative L2 error ||q(x) - x|| / ||x|| that
  round-to-nearest adds to the values the format keeps (neither flushed nor
  beyond its max), estimated from the format's spacing: a value in binade b
  (2^b <= |x 2^s| < 2^(b+1)) lies within ulp(b) = 2^(max(b, emin) - man_bits)
  of its neighbours and its error is taken as uniform on (-ulp/2, ulp/2), mean
  square ulp^2 / 12; exact powers of two are representable and add nothing.
  It is an expectation, not a bound: tests hold it to the measured error of
  random data within a few percent.

The shares do not depend on the scale except through which values flush or
overflow; `rounding_rel_error` grows when the scale pushes values into the
subnormal range. Float32 subnormals (`tiny`) are treated as the counts treat
them: all flushed unless all of them survive. Update records carry no mass
(their lost updates are counted apart): every number is None there.

`RowMass` measures the same numbers on real values and their quantised
values, row by row (the recipe probe: recipe_probe.py), instead of
estimating them from the histogram.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .histogram import E_LO, MASS_SIZE, TINY_LOG2_RANGE, Log2Histogram

EFFECT_KEYS = ("mass_lost_l1", "mass_lost_l2", "mass_clipped_l1", "mass_clipped_l2", "rounding_rel_error")
"""The numbers `effect` gives, in the order report.json lists them."""
_FIELD_OF_BINADE = 127   # float32 exponent field of binade e: e + 127


@dataclasses.dataclass(frozen=True)
class Mass:
    """Sum of |x| (`l1`) and of x^2 (`l2`) per float32 exponent field F (0: tiny values; 255: float64 values of
    2^128 and more), float64[256] each, from the MASS_SIZE layout of histogram.py."""

    l1: np.ndarray
    l2: np.ndarray

    @classmethod
    def from_raw(cls, raw) -> "Mass":
        raw = np.asarray(raw, dtype=np.float64)
        if raw.shape != (MASS_SIZE,):
            raise ValueError(f"raw mass must have shape ({MASS_SIZE},), got {raw.shape}")
        return cls(raw[:256].copy(), raw[256:].copy())

    def to_dict(self) -> dict:
        """report.json's form: the nonzero fields only, {"fields": [F, ...], "l1": [...], "l2": [...]}."""
        fields = np.flatnonzero((self.l1 != 0) | (self.l2 != 0))
        return {"fields": fields.tolist(), "l1": self.l1[fields].tolist(), "l2": self.l2[fields].tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "Mass":
        l1, l2 = np.zeros(256), np.zeros(256)
        l1[data["fields"]], l2[data["fields"]] = data["l1"], data["l2"]
        return cls(l1, l2)

    @property
    def total_l1(self) -> float:
        return float(self.l1.sum())

    @property
    def total_l2(self) -> float:
        return float(self.l2.sum())


@np.errstate(invalid="ignore", over="ignore")   # a mass beyond float64 (Inf): NaN shares, no warning
def effects(hist: Log2Histogram, mass: Mass | None, lim, scales, overflows, rounding: bool = True) -> dict:
    """EFFECT_KEYS -> float64 array over `scales` (log2 scales applied before the cast), for format `lim`.

    lim: one FormatLimits, or one per scale (several formats in one call: a report asks for every format
    of every tensor). overflows: per scale, whether anything overflows there (decided exactly from the
    amax, see TensorStats.overflows). All NaN without mass or without nonzero mass. rounding=False leaves
    `rounding_rel_error` out (the flush errors of the loss-scale windows need only the shares, at 513 scales).
    """
    keys = EFFECT_KEYS if rounding else tuple(key for key in EFFECT_KEYS if key != "rounding_rel_error")
    scales = np.asarray(scales, dtype=np.int64).reshape(-1)
    if mass is None or not mass.total_l2 > 0:
        return {key: np.full(scales.shape, np.nan) for key in keys}
    limits = [lim] if not isinstance(lim, (list, tuple)) else list(lim)
    if len(limits) not in (1, len(scales)):
        raise ValueError(f"effects: {len(limits)} format limits for {len(scales)} scales")
    columns = np.array([(x.zero_exponent, x.emin, x.emax, x.fmt.man_bits, x.tie_to_zero) for x in limits],
                       dtype=np.int64).reshape(-1, 5)
    z, emin, emax, man, tie_to_zero = np.broadcast_to(columns, (len(scales), 5)).T
    total = {"l1": mass.total_l1, "l2": mass.total_l2}
    out = {}
    # flushed: the binades e with e + s < z (fields 1 .. z - s - 1 + 127), the ties at 2^z, the tiny values
    first_kept_field = np.clip(z - scales + _FIELD_OF_BINADE, 1, 255)
    tie = z - scales                                      # binade of the values that land on 2^z
    tie_bin = tie - E_LO
    inside = (tie_bin >= 0) & (tie_bin < len(hist.pow2)) & (tie_to_zero != 0)
    ties = np.where(inside, hist.pow2[np.clip(tie_bin, 0, len(hist.pow2) - 1)], 0)
    tiny_lost = TINY_LOG2_RANGE[0] + scales <= z
    beyond_field = np.clip(emax - scales + _FIELD_OF_BINADE, 0, 256)   # first field of the binade emax - s
    overflows = np.broadcast_to(np.asarray(overflows, dtype=bool), scales.shape)
    for norm, power in (("l1", 1), ("l2", 2)):
        per_field = getattr(mass, norm)
        below = np.concatenate([[0.0], np.cumsum(per_field)])          # below[k]: the fields < k
        lost = below[first_kept_field] - below[1] + ties * np.exp2(power * tie.astype(np.float64))
        lost = lost + np.where(tiny_lost, per_field[0], 0.0)
        clipped = np.where(overflows, below[256] - below[beyond_field], 0.0)
        out[f"mass_lost_{norm}"] = np.minimum(lost / total[norm], 1.0)
        out[f"mass_clipped_{norm}"] = np.minimum(clipped / total[norm], 1.0)
    if not rounding:
        return {key: out[key] for key in keys}
    # rounding: per bin after scaling, inexact values x ulp^2 / 12, ulp back in unscaled units (only the bins
    # holding values: the others add nothing, and a report asks this at a hundred scales per tensor and format)
    used = np.flatnonzero(hist.counts)
    counts, pow2 = hist.counts[used], hist.pow2[used]
    binades = used[None, :] + E_LO + scales[:, None]
    zc, emaxc = z[:, None], emax[:, None]
    kept = (binades >= zc) & (binades <= emaxc)
    exact = np.where(binades > zc, pow2, 0) + np.where((binades == zc) & (tie_to_zero[:, None] != 0), pow2, 0)
    ulp_log2 = np.maximum(binades, emin[:, None]) - man[:, None] - scales[:, None]
    squared = np.where(kept, (counts - exact) * np.exp2(2.0 * ulp_log2), 0.0).sum(axis=1) / 12
    top_tiny = TINY_LOG2_RANGE[1] - 1 + scales                        # tiny values kept: their top binade's spacing
    tiny_kept = (TINY_LOG2_RANGE[0] + scales > z) & (top_tiny <= emax)
    squared = squared + np.where(tiny_kept, hist.tiny * np.exp2(2.0 * (np.maximum(top_tiny, emin) - man - scales))
                                 / 12, 0.0)
    out["rounding_rel_error"] = np.sqrt(squared / total["l2"])
    return {key: out[key] for key in EFFECT_KEYS}


def tensor_effects(stats, scales_by_format: dict) -> dict:
    """{format limits: {EFFECT_KEYS -> list over its scales (log2)}} for one TensorStats, every format in one
    pass (None each where it has no mass)."""
    lims, scales = [], []
    for lim, its in scales_by_format.items():
        lims += [lim] * len(its)
        scales += list(its)
    overflows = np.concatenate([stats.overflows_at(lim, its) for lim, its in scales_by_format.items()] or [[]])
    arrays = effects(stats.hist, stats.mass, lims, scales, overflows)
    lists = {key: [v if v == v else None for v in values.tolist()] for key, values in arrays.items()}  # NaN: None
    out, start = {}, 0
    for lim, its in scales_by_format.items():
        out[lim] = {key: values[start:start + len(its)] for key, values in lists.items()}
        start += len(its)
    return out


# ------------------------------------------------------- measured on real values
MEASURED_KEYS = ("rel_error", "mass_lost_l1", "mass_lost_l2", "mass_clipped_l1", "mass_clipped_l2")
"""What `loss_shares` gives: the numbers above, measured on real values and their quantised values."""
LOSS_SUMS = ("rows", *MEASURED_KEYS)
"""What `RowMass.loss_sums` gives: the rows measured and each of MEASURED_KEYS summed over them (sums pool by
addition)."""


class RowMass:
    """The rows of a 2-D tensor x with their mass, measured once for the LOSS_SUMS of several quantisations.

    Per row r with nonzero mass (a row is one dot product of a GEMM: an
    output channel of a weight, a token of an activation): ||q_r - x_r|| /
    ||x_r||, and the shares of sum |x_r| and of sum x_r^2 carried by the
    values lost (nonzero in x, zero in q: the values `effects` counts as
    flushed) and by the values clipped (past the format's overflow threshold
    after scaling, which a saturating cast turns into its max). Rows count
    alike, so that a row flushed whole weighs as much as any other, however
    small its values.
    """

    def __init__(self, x):
        self.x = np.asarray(x, dtype=np.float64)
        self.magnitude = np.abs(self.x)
        self.square = np.square(self.x)
        l2 = self.square.sum(axis=-1)
        self.rows = l2 > 0
        self.l1, self.l2 = self.magnitude.sum(axis=-1)[self.rows], l2[self.rows]

    def loss_sums(self, q, beyond) -> np.ndarray:
        """LOSS_SUMS of x quantised to q (x's shape); beyond: boolean mask of the values clipped. float64[6]."""
        q = np.asarray(q, dtype=np.float64)
        rows = self.rows
        out = [rows.sum(), np.sqrt(np.square(q - self.x).sum(axis=-1)[rows] / self.l2).sum()]
        for mask in ((q == 0) & (self.x != 0), np.asarray(beyond, dtype=bool)):    # flushed, clipped
            if mask.any():
                out += [((self.magnitude * mask).sum(axis=-1)[rows] / self.l1).sum(),
                        ((self.square * mask).sum(axis=-1)[rows] / self.l2).sum()]
            else:
                out += [0.0, 0.0]
        return np.array(out, dtype=np.float64)


def loss_shares(sums) -> dict:
    """MEASURED_KEYS from pooled LOSS_SUMS: each a mean over the rows measured (None each without rows)."""
    sums = np.asarray(sums, dtype=np.float64)
    if not sums[0] > 0:
        return {key: None for key in MEASURED_KEYS}
    return {key: float(v / sums[0]) for key, v in zip(MEASURED_KEYS, sums[1:])}
