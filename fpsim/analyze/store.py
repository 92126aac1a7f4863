"""Accumulators of an observed run, with bounded memory and no host synchronisation.

Hooks hand each observed tensor's counts here (`add`): the log2 histograms
(one row per (module, kind) record), the mass per binade beside them (sum of
|x| and of x^2, float64), the running amax, the first step that
saw Inf or NaN, the per-format counts of updates a low-precision weight would
lose, and the per-step amax of all gradients (a bounded array: when full,
neighbouring steps merge by max and each entry then stands for twice as many
steps). The tables are torch tensors on the device of the first tensor seen.

Counts made on the host (the compiled kernel's compact pairs, for CPU
tensors) are added to CPU tables at once, in place. Counts made on a device
wait in a short list and are folded into the tables at the end of the step
(`flush`), with a few torch operations and no host read; everything stays on
the device until `snapshot()`, the one place that reads back to the host.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .histogram import MASS_SIZE, RAW_SIZE, dense_counts

try:
    from .. import _fasthist
except ImportError:  # built without a compiler: torch operations count everything (histogram.py)
    _fasthist = None

NO_STEP = 2**62
"""first_nonfinite value of a record that never saw Inf or NaN."""
KINDS = ("activation", "activation_grad", "weight", "weight_grad", "optimizer_grad", "update")
"""The kinds of tensor a record holds, in the order reports list them."""
GRADIENT_KINDS = ("activation_grad", "weight_grad")
"""The gradients a loss scale multiplies, as backward produced them (optimizer_grad is for reference only)."""
MAX_PENDING = 512


@dataclasses.dataclass
class Snapshot:
    """Host copy of the accumulators (numpy), in record order."""

    keys: list
    raw: np.ndarray            # (R, RAW_SIZE) int64
    mass: np.ndarray           # (R, MASS_SIZE) float64: sum |x| and sum x^2 per exponent field (histogram.py)
    amax: np.ndarray           # (R,) float32
    first_nonfinite: np.ndarray  # (R,) int64, NO_STEP when never
    samples: np.ndarray        # (R,) int64: tensors counted
    lost: np.ndarray           # (R, F) int64: updates lost per format (update records)
    step_amax: np.ndarray      # (S,) float32: gradient amax per entry, -inf where nothing was observed
    steps_per_entry: int


def nan_max(a: float, b: float) -> float:
    """max(a, b), NaN when either is NaN (as torch.maximum)."""
    if a != a or b != b:
        return math.nan
    return a if a >= b else b


class Store:
    """All accumulators of one watch, on one device."""

    def __init__(self, n_formats: int, step_capacity: int = 65536):
        if step_capacity < 2 or step_capacity % 2:
            raise ValueError(f"step_capacity must be an even int >= 2, got {step_capacity!r}")
        self.n_formats = n_formats
        self.step_capacity = step_capacity
        self.device = None
        self.keys: list = []               # (record name, kind) of each row
        self.index: dict = {}              # kind -> {record name -> row}
        self.samples: list[int] = []
        self._gradient: list[bool] = []    # per row: a gradient kind (feeds the per-step amax)
        self._pending: list = []
        self._pending_lost: list = []
        self._pending_mass: list = []
        self._rows_cache: dict = {}
        self._host = None                  # (addresses of the CPU tables, their rows) for the kernel; None elsewhere
        self._host_mass = None             # the CPU mass table as numpy, added to in place; None elsewhere
        self._step_gradient_amax = -math.inf  # the largest gradient amax added on the host this step

    # --------------------------------------------------------------- tables
    def _allocate(self, device) -> None:
        import torch

        self.device = device
        self.raw = torch.zeros((0, RAW_SIZE), dtype=torch.int64, device=device)
        self.mass = torch.zeros((0, MASS_SIZE), dtype=torch.float64, device=device)
        self.amax = torch.zeros(0, dtype=torch.float32, device=device)
        self.first_nonfinite = torch.zeros(0, dtype=torch.int64, device=device)
        self.lost = torch.zeros((0, self.n_formats), dtype=torch.int64, device=device)
        self.step_amax = torch.full((self.step_capacity,), -torch.inf, dtype=torch.float32, device=device)
        self.steps_per_entry = 1
        self._view()

    def _view(self) -> None:
        """Refresh what the kernel writes through (after any table was replaced)."""
        if self.device is not None and self.device.type == "cpu" and _fasthist is not None:
            self._host = (self.raw.data_ptr(), self.amax.data_ptr(), self.first_nonfinite.data_ptr(),
                          self.mass.data_ptr(), self.raw.shape[0])
        if self.device is not None and self.device.type == "cpu":
            self._host_mass = self.mass.numpy()

    def row(self, name: str, kind: str, tensor) -> int:
        """The row of the (name, kind) record, created on first use on `tensor`'s device (tables grow by doubling)."""
        rows = self.index.get(kind)
        if rows is None:
            rows = self.index[kind] = {}
        found = rows.get(name)
        if found is not None:
            return found
        if self.device is None:
            self._allocate(tensor.device)
        row = len(self.keys)
        if row == self.raw.shape[0]:
            self._grow(max(16, 2 * row))
        rows[name] = row
        self.keys.append((name, kind))
        self.samples.append(0)
        self._gradient.append(kind in GRADIENT_KINDS)
        return row

    def _grow(self, rows: int) -> None:
        import torch

        def grown(table, fill):
            bigger = torch.full((rows, *table.shape[1:]), fill, dtype=table.dtype, device=table.device)
            bigger[:table.shape[0]] = table
            return bigger

        self.raw = grown(self.raw, 0)
        self.mass = grown(self.mass, 0.0)
        self.amax = grown(self.amax, 0.0)
        self.first_nonfinite = grown(self.first_nonfinite, NO_STEP)
        self.lost = grown(self.lost, 0)
        self._view()

    # ------------------------------------------------------------- updates
    def add(self, row: int, counts, amax, step: int, samples: int = 1, mass=None) -> None:
        """Add one tensor's counts and amax (or those of `samples` tensors together) to `row`, as an observation
        of `step`, and its mass (float64[MASS_SIZE], numpy or torch) when given.

        counts: the kernel's pairs (bytes, with a float amax), added to CPU
        tables at once; or int64[RAW_SIZE] (numpy or torch), folded in at the
        next flush. Mass as numpy goes into CPU tables at once, else at the flush.
        """
        self.samples[row] += samples
        host = self._host
        if mass is not None and (host is None or type(counts) is not bytes):   # (else the kernel adds it)
            if self._host_mass is not None and type(mass) is np.ndarray:
                self._host_mass[row] += mass
            else:
                self._pending_mass.append((row, mass))
        if host is None or type(counts) is not bytes:
            if type(counts) is bytes:
                counts = dense_counts(counts)
            self._pending.append((row, counts, amax))
            if len(self._pending) >= MAX_PENDING:
                self.flush(step)
            return
        _fasthist.accumulate(host, row, counts, amax, step, mass)
        if self._gradient[row]:
            self._step_gradient_amax = nan_max(self._step_gradient_amax, amax)

    def count_into(self, row: int, address: int, n: int, kind: int, step: int, mass: bool = True):
        """Count n values of a CPU buffer (kind as the kernel's: 0 float32, 1 float16, 2 bfloat16) into `row` at
        once, with their mass when `mass`: one kernel call. Only for CPU tables (`on_host`). (amax, record):
        the record adds the same observation again through `add_record`."""
        amax, record = _fasthist.count_into(self._host, row, address, n, kind, step, mass)
        self.samples[row] += 1
        if self._gradient[row]:
            self._step_gradient_amax = nan_max(self._step_gradient_amax, amax)
        return amax, record

    def add_record(self, row: int, record: bytes, amax: float, step: int) -> None:
        """Add an observation counted by `count_into` (under another row: the same tensor seen again) to `row`."""
        _fasthist.add_record(self._host, row, record, amax, step)
        self.samples[row] += 1
        if self._gradient[row]:
            self._step_gradient_amax = nan_max(self._step_gradient_amax, amax)

    @property
    def on_host(self) -> bool:
        """Whether the tables are CPU ones the kernel writes into (count_into, add_record)."""
        return self._host is not None

    def count_rows(self, items, kind: int, step: int, samples=None, mass: bool = True) -> None:
        """Count CPU buffers into rows with the kernel, one observation per row: items ((row, ((address, n),
        ...)), ...), kind as the kernel's (0 float32, 1 float16, 2 bfloat16), samples: the tensors each item
        holds (default 1). All rows in one call (a module's weights or gradients each: hundreds of modules).
        Not for gradient kinds (their amax feeds the per-step amax, which `add` keeps)."""
        if any(self._gradient[row] for row, _ in items):
            raise ValueError(f"count_rows is not for the gradient kinds {GRADIENT_KINDS}")
        samples = [1] * len(items) if samples is None else samples
        if self._host is not None:
            _fasthist.count_rows(self._host, items, kind, step, mass)
            for (row, _), n in zip(items, samples):
                self.samples[row] += n
            return
        for (row, parts), n in zip(items, samples):   # tables on another device: folded in at the flush
            masses = np.zeros(MASS_SIZE) if mass else None
            amax, pairs = _fasthist.count_parts(parts, kind, *(() if masses is None else (masses,)))
            self.add(row, pairs, amax, step, n, mass=masses)

    def count_updates(self, items, last, step: int) -> None:
        """Count the float32 updates of CPU parameters and those lost per format (`last`: the kernel's table)
        into update rows: items ((row, before, ((address, n), ...)), ...), `before` the address of those
        parameters' old values, laid end to end. All rows in one call."""
        if self._host is not None:
            _fasthist.updates_rows(self._host, self.lost.data_ptr(), items, last, self.n_formats, step)
            for row, _, _ in items:
                self.samples[row] += 1
            return
        for row, before, parts in items:
            lost = np.zeros(self.n_formats, dtype=np.int64)
            amax, pairs = _fasthist.updates(before, parts, last, self.n_formats, lost)
            self.add(row, pairs, amax, step)
            self.add_lost(row, lost)

    def add_lost(self, row: int, lost) -> None:
        """Add per-format counts of lost updates (int64 [n_formats], numpy or torch) for an update record."""
        if self._host is not None and isinstance(lost, np.ndarray):
            self.lost.numpy()[row] += lost
        else:
            self._pending_lost.append((row, lost))

    def _rows(self, rows: tuple):
        import torch

        cached = self._rows_cache.get(rows)
        if cached is None:
            if len(self._rows_cache) > 64:
                self._rows_cache.clear()
            gradient = [self._gradient[r] for r in rows]
            cached = (torch.tensor(rows, dtype=torch.int64, device=self.device),
                      torch.tensor(gradient, dtype=torch.bool, device=self.device))
            self._rows_cache[rows] = cached
        return cached

    def flush(self, step: int) -> None:
        """Fold everything queued into the tables, as observations of `step`."""
        import torch

        if self._step_gradient_amax != -math.inf:
            self._record_step_amax(step, torch.tensor(self._step_gradient_amax, dtype=torch.float32))
            self._step_gradient_amax = -math.inf
        if self._pending:
            rows = tuple(r for r, _, _ in self._pending)
            index, is_gradient = self._rows(rows)
            counts = torch.stack([_tensor(c, self.device, torch.int64) for _, c, _ in self._pending])
            wide = torch.stack([_tensor(v, self.device, torch.float64) for _, _, v in self._pending])
            amaxes = wide.float()          # (a float64 tensor's finite amax beyond float32's range: Inf here)
            self._pending = []
            self.raw.index_add_(0, index, counts)
            self.amax.scatter_reduce_(0, index, amaxes, reduce="amax")
            seen_bad = torch.where(torch.isfinite(wide), NO_STEP, step)
            self.first_nonfinite.scatter_reduce_(0, index, seen_bad, reduce="amin")
            gradient_amax = torch.where(is_gradient, amaxes, -torch.inf).amax()
            self._record_step_amax(step, gradient_amax)
        if self._pending_lost:
            rows = tuple(r for r, _ in self._pending_lost)
            index, _ = self._rows(rows)
            lost = torch.stack([_tensor(v, self.device, torch.int64) for _, v in self._pending_lost])
            self._pending_lost = []
            self.lost.index_add_(0, index, lost)
        if self._pending_mass:
            rows = tuple(r for r, _ in self._pending_mass)
            index, _ = self._rows(rows)
            mass = torch.stack([_tensor(v, self.device, torch.float64) for _, v in self._pending_mass])
            self._pending_mass = []
            self.mass.index_add_(0, index, mass)

    def _record_step_amax(self, step: int, value) -> None:
        import torch

        while step // self.steps_per_entry >= self.step_capacity:
            merged = self.step_amax.view(-1, 2).amax(dim=1)
            self.step_amax = torch.cat([merged, torch.full_like(merged, -torch.inf)])
            self.steps_per_entry *= 2
        i = step // self.steps_per_entry
        self.step_amax[i:i + 1] = torch.maximum(self.step_amax[i:i + 1], value.to(self.device))

    # ------------------------------------------------------------ reading
    def snapshot(self, reduce_across_ranks: bool = False, replicated_kinds=()) -> Snapshot:
        """Host copy of everything; with `reduce_across_ranks`, summed / maxed over the torch.distributed group.

        Records of `replicated_kinds` (identical on every rank under DDP:
        weights, their gradients after all-reduce, updates) are taken from rank 0
        instead of summed.
        """
        if reduce_across_ranks:
            return self._reduced_snapshot(replicated_kinds)
        if self.device is None:
            return Snapshot([], np.zeros((0, RAW_SIZE), np.int64), np.zeros((0, MASS_SIZE)), np.zeros(0, np.float32),
                            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, self.n_formats), np.int64),
                            np.zeros(0, np.float32), 1)
        n = len(self.keys)
        return Snapshot(list(self.keys), self.raw[:n].cpu().numpy().copy(), self.mass[:n].cpu().numpy().copy(),
                        self.amax[:n].cpu().numpy().copy(),
                        self.first_nonfinite[:n].cpu().numpy().copy(), np.array(self.samples, dtype=np.int64),
                        self.lost[:n].cpu().numpy().copy(), self.step_amax.cpu().numpy().copy(),
                        self.steps_per_entry)

    def _reduced_snapshot(self, replicated_kinds) -> Snapshot:
        import torch
        import torch.distributed as dist

        local = self.snapshot()
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, (local.keys, local.steps_per_entry, len(local.step_amax)))
        keys = sorted({tuple(k) for keys, _, _ in gathered for k in keys})
        stride = max(s for _, s, _ in gathered)
        rank = dist.get_rank()
        if dist.get_backend() in ("gloo", "mpi"):
            device = torch.device("cpu")
        else:  # NCCL reduces CUDA tensors
            device = self.device if self.device is not None else torch.device("cuda", torch.cuda.current_device())
        where = {tuple(k): i for i, k in enumerate(local.keys)}
        R, F = len(keys), self.n_formats

        def aligned(table, fill, shape_tail=()):
            out = np.full((R, *shape_tail), fill, dtype=table.dtype)
            for j, k in enumerate(keys):
                if k in where:
                    out[j] = table[where[k]]
            return out

        raw = aligned(local.raw, 0, (RAW_SIZE,))
        mass = aligned(local.mass, 0.0, (MASS_SIZE,))
        samples = aligned(local.samples, 0)
        lost = aligned(local.lost, 0, (F,))
        replicated = np.array([k[1] in replicated_kinds for k in keys], dtype=bool)
        if rank != 0:
            raw[replicated] = 0
            mass[replicated] = 0.0
            samples[replicated] = 0
            lost[replicated] = 0
        step_amax = _restride(local.step_amax, local.steps_per_entry, stride)
        sums = torch.from_numpy(np.concatenate([raw.ravel(), samples, lost.ravel()])).to(device)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        mass_sums = torch.from_numpy(mass.ravel()).to(device)
        dist.all_reduce(mass_sums, op=dist.ReduceOp.SUM)
        maxima = torch.from_numpy(np.concatenate([aligned(local.amax, 0.0), step_amax]).astype(np.float32)).to(device)
        # a NaN amax (the run diverged) must survive the MAX whatever the backend does with NaN
        nan_flags = torch.isnan(maxima).to(torch.int32)
        maxima = torch.where(torch.isnan(maxima), torch.zeros_like(maxima), maxima)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        dist.all_reduce(nan_flags, op=dist.ReduceOp.MAX)
        maxima[nan_flags.bool()] = torch.nan
        minima = torch.from_numpy(aligned(local.first_nonfinite, NO_STEP)).to(device)
        dist.all_reduce(minima, op=dist.ReduceOp.MIN)
        sums = sums.cpu().numpy()
        maxima = maxima.cpu().numpy()
        n_raw = R * RAW_SIZE
        return Snapshot(
            [tuple(k) for k in keys],
            sums[:n_raw].reshape(R, RAW_SIZE),
            mass_sums.cpu().numpy().reshape(R, MASS_SIZE),
            maxima[:R],
            minima.cpu().numpy(),
            sums[n_raw:n_raw + R],
            sums[n_raw + R:].reshape(R, F),
            maxima[R:],
            stride,
        )


def _restride(step_amax: np.ndarray, stride: int, target: int) -> np.ndarray:
    """Merge a per-step amax array from `stride` steps per entry to `target` (a multiple), by max."""
    factor = target // stride
    if factor == 1:
        return step_amax
    merged = step_amax.reshape(-1, factor).max(axis=1)
    return np.concatenate([merged, np.full(len(step_amax) - len(merged), -np.inf, dtype=step_amax.dtype)])


def _tensor(value, device, dtype):
    """A queued count or amax (torch tensor, numpy array or float) as a tensor on the store's device."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, dtype)
    return torch.as_tensor(value, dtype=dtype).to(device)
