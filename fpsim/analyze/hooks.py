"""`fpsim.watch`: attach to a training run and count every layer's tensors on a log2 scale.

Forward hooks count module outputs (`activation`) and hang a tensor hook on
each output to count its gradient (`activation_grad`). Optimizer step hooks
count the parameters (`weight`), their gradients as the optimizer sees them
(`weight_grad`: accumulated, all-reduced, clipped, unscaled) and the change
the step makes (`update`, from a copy taken just before the step). Hooks
never modify a tensor, never read a value back to the host, and never raise
into the run: the first error is reported with warnings.warn and observation
stops while training goes on.

A step is one optimizer step that follows a forward pass of the watched
model; with `every=N` only steps 0, N, 2N, ... are counted.
"""

from __future__ import annotations

import time
import warnings
import weakref

from .histogram import Log2Counter
from .limits import resolve_formats
from .store import Store

KINDS = ("activation", "activation_grad", "weight", "weight_grad", "update")
"""The tensor kinds a watch can record."""
DEFAULT_FORMATS = ("fp16", "bf16", "e4m3", "e5m2")
MODULE_PRESETS = ("params", "leaves", "all")
"""modules=: "params" (the default, also None): the modules holding parameters of their own; "leaves":
those, every module without children (activation functions, dropout, ...) and the model itself; "all":
every module."""
REPLICATED_KINDS = ("weight", "weight_grad", "update")
"""Identical on every rank under DDP: taken from rank 0, not summed."""


class StopRun(BaseException):
    """Raised out of an optimizer step to end an observed run early (`fpsim analyze --steps N`).

    A BaseException, so that a training script's `except Exception` does not swallow it.
    """


def watch(model, formats=DEFAULT_FORMATS, **options) -> "Watcher":
    """Observe `model` (any torch.nn.Module; None: every module that runs) while it trains, as a context manager.

        with fpsim.watch(model, formats=("fp16", "bf16", "e4m3", "e5m2")) as w:
            ...                      # the training loop, unchanged
        report = w.report()
        report.save("out/")

    formats: names or fpsim.Format objects (signed, with a zero).
    kinds: which of KINDS to record (default all).
    modules: "params" (default; None too): every module holding parameters of
        its own (the layers); "leaves": those, every module without children
        (activation functions, ...) and the model itself; "all": every module;
        or a sequence of qualified names (as in model.named_modules(); the
        model itself by its class name) and module types.
    every: count steps 0, N, 2N, ... only.
    optimizer: hook this optimizer only (default: any optimizer stepping the
        model's parameters).
    underflow_threshold: the largest tolerated fraction of nonzero values
        flushed to zero (default 1e-3), for the verdicts.
    fp8_margin: binades of headroom below max for the per-tensor (FP8) scales.
    scale_range: (lo, hi), the log2 loss scales searched (default (-32, 64)).
    out: a directory; when given, the report is written there when the block
        ends, also when the run raises or is interrupted.
    on_step: called with the step number after each step (progress displays).
    step_capacity: how many per-step gradient amax entries to keep (default
        65536; beyond, neighbouring steps merge by max).
    """
    return Watcher(model, formats, **options)


class Watcher:
    """The state of one observation: hooks, accumulators, step counter."""

    def __init__(self, model, formats=DEFAULT_FORMATS, *, kinds=KINDS, modules=None, every: int = 1,
                 optimizer=None, underflow_threshold: float = 1e-3, fp8_margin: int = 0,
                 scale_range=(-32, 64), out=None, on_step=None, step_capacity: int = 65536):
        import torch

        self.limits = resolve_formats(formats)
        self.kinds = _check_kinds(kinds)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int (count every N-th step), got {every!r}")
        from .verdicts import Settings

        self.settings = Settings.checked(underflow_threshold, fp8_margin, scale_range)
        if model is not None:
            model = _unwrap(model)
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable, got {on_step!r}")
        self.every = every
        self.out = out
        self.on_step = on_step
        self.model = model
        self._optimizer = optimizer
        self._module_filter = modules
        self._store = Store(len(self.limits), step_capacity)
        self._counter = Log2Counter()
        self._names: dict = {}         # module -> record name (selected modules)
        self._known: dict = {}         # module -> qualified name (every module seen, global mode)
        self._types: dict = {}         # record name -> module class name
        self._param_owner: dict = {}   # parameter -> record name
        self._roots: dict = {}         # label -> root module (global mode)
        self._optimizer_params = weakref.WeakKeyDictionary()  # optimizer -> its parameters by module
        self._snapshots: dict = {}
        self._handles: list = []
        self._optimizer_handles: list = []
        self.step = 0
        self.steps_observed = 0
        self._sampled = True
        self._forward_since_step = False
        self._active = False
        self._attached = False
        self.status = "running"
        self.error = None
        self.observation_error = None
        self.started = None
        self.elapsed = 0.0
        self.last_report = None
        self.saved_paths: dict = {}
        self._rank, self._world = 0, 1
        if model is not None:
            self._select(model, _label(model))
        # update lost in format f when field_u <= max(field_w, emin_f + 127) - (man_bits_f + 2)
        self._lost_thresholds = [(lim.emin + 127, lim.fmt.man_bits + 2) for lim in self.limits]
        self._lost_matrices: dict = {}

    # --------------------------------------------------------------- naming
    def _select(self, root, label: str) -> None:
        """Name every module under `root` and pick the ones to record (fails on unknown names)."""
        import torch

        core = _unwrap(root)
        wrapper = core is not root  # DDP / DataParallel seen by the global hooks: name the inside
        named = []
        for name, mod in root.named_modules():
            if wrapper:
                name = name[len("module."):] if name.startswith("module.") else ("" if name == "module" else name)
            named.append((label if not name else (name if self.model is root else f"{label}.{name}"), mod))
        spec = self._module_filter
        if spec is None or spec in MODULE_PRESETS:
            def wanted(mod) -> bool:
                if wrapper and mod is root:
                    return False
                if spec == "all" or any(True for _ in mod.parameters(recurse=False)):
                    return True
                return spec == "leaves" and (mod is core or not any(True for _ in mod.children()))
            chosen = {mod for _, mod in named if wanted(mod)}
        else:
            if isinstance(spec, (str, type)):
                spec = [spec]
            if not isinstance(spec, (list, tuple, set, frozenset)):
                raise TypeError(f"modules must be one of {', '.join(MODULE_PRESETS)}, a module name or type, or a "
                                f"sequence of them; got {type(spec).__name__} {spec!r}")
            names = [s for s in spec if isinstance(s, str)]
            types = [s for s in spec if isinstance(s, type)]
            bad = [s for s in spec if not isinstance(s, (str, type))]
            if bad:
                raise TypeError(f"modules holds {bad[0]!r}; give qualified names (str) or module types")
            bad_types = [t for t in types if not issubclass(t, torch.nn.Module)]
            if bad_types:
                raise TypeError(f"modules holds {bad_types[0]!r}, which is not a torch.nn.Module type")
            known = {qual for qual, _ in named}
            missing = [n for n in names if n not in known and not (n == "" and self.model is root)]
            if missing and self.model is not None:
                listing = ", ".join(sorted(known))
                raise ValueError(f"no module named {missing[0]!r} in the model; the modules are: {listing}")
            chosen = {mod for qual, mod in named
                      if qual in names or (mod is core and "" in names) or isinstance(mod, tuple(types))}
        for qual, mod in named:
            if mod in self._known:
                continue
            self._known[mod] = qual
            if mod in chosen:
                self._names[mod] = qual
                self._types[qual] = type(mod).__name__
                for p in mod.parameters(recurse=False):
                    self._param_owner.setdefault(p, qual)

    def _adopt(self, module) -> None:
        """Global mode: a module called for the first time, outside any known model, is a root."""
        base = type(_unwrap(module)).__name__
        label, n = base, 2
        while label in self._roots:
            label = f"{base}#{n}"
            n += 1
        self._roots[label] = module
        self._select(module, label)

    # --------------------------------------------------------- attach/detach
    def attach(self) -> "Watcher":
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        if self._attached:
            raise RuntimeError("this watch is already attached; a Watcher observes one run")
        self._attached = True
        self._active = True
        self.started = time.perf_counter()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if self.model is None:
            self._handles.append(nn_module.register_module_forward_pre_hook(self._on_forward_pre_global))
            self._handles.append(nn_module.register_module_forward_hook(self._on_forward))
        else:
            hooked = set(self._names) | {self.model}
            for mod in hooked:
                self._handles.append(mod.register_forward_hook(self._on_forward))
        if self._optimizer is not None:
            self._optimizer_handles += [self._optimizer.register_step_pre_hook(self._on_step_pre),
                                        self._optimizer.register_step_post_hook(self._on_step_post)]
        else:
            self._optimizer_handles += [optim_module.register_optimizer_step_pre_hook(self._on_step_pre),
                                        optim_module.register_optimizer_step_post_hook(self._on_step_post)]
        return self

    def close(self) -> None:
        """Detach every hook (idempotent); the counts stay for report()."""
        self._active = False
        for handle in self._handles + self._optimizer_handles:
            handle.remove()
        self._handles, self._optimizer_handles = [], []
        self._snapshots.clear()
        if self.started is not None:
            self.elapsed = time.perf_counter() - self.started

    def __enter__(self) -> "Watcher":
        return self.attach()

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        if exc_type is None:
            self.status = "completed"
        elif issubclass(exc_type, KeyboardInterrupt):
            self.status, self.error = "interrupted", "KeyboardInterrupt"
        elif issubclass(exc_type, StopRun):
            self.status = "stopped"
        elif issubclass(exc_type, SystemExit) and getattr(exc, "code", None) in (None, 0):
            self.status = "completed"
        else:
            self.status, self.error = "error", f"{exc_type.__name__}: {exc}"
        if self.out is not None:
            try:
                self.last_report = self.report()
                self.saved_paths = self.last_report.save(self.out)
            except Exception as err:  # never mask the run's own exception
                if exc_type is None:
                    raise
                warnings.warn(f"fpsim.watch: could not write the report to {self.out}: {err}", RuntimeWarning)
        return False

    def _fail(self, err: BaseException) -> None:
        """First error inside a hook: say so once, stop observing, let training go on."""
        if not self._active:
            return
        self._active = False
        self.observation_error = f"{type(err).__name__}: {err}"
        warnings.warn(f"fpsim.watch: observation stopped after an error in its hook ({self.observation_error}); "
                      f"training continues unobserved", RuntimeWarning, stacklevel=3)
        # module hooks can go now; optimizer hooks are removed by close() (torch may be iterating them)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._snapshots.clear()

    # ----------------------------------------------------------------- hooks
    def _on_forward_pre_global(self, module, args):
        if self._active and module not in self._known:
            try:
                self._adopt(module)
            except Exception as err:
                self._fail(err)

    def _on_forward(self, module, args, output):
        if not self._active:
            return
        try:
            import torch

            self._forward_since_step = True
            name = self._names.get(module)
            if name is None or not self._sampled or not torch.is_grad_enabled():
                return
            for t in _float_tensors(output):
                if "activation" in self.kinds:
                    self._count(name, "activation", t)
                if "activation_grad" in self.kinds and t.requires_grad:
                    t.register_hook(self._gradient_hook(name))
        except Exception as err:
            self._fail(err)

    def _gradient_hook(self, name: str):
        def on_gradient(grad):
            if self._active:
                try:
                    self._count(name, "activation_grad", grad)
                except Exception as err:
                    self._fail(err)
        return on_gradient

    def _on_step_pre(self, optimizer, args, kwargs):
        if not self._active:
            return
        try:
            groups = self._params_of(optimizer)
            if not groups or not self._sampled:
                return
            for name, params in groups:
                weights = _flat(params, copy="update" in self.kinds)  # the copy is the update's "before"
                if "weight" in self.kinds:
                    self._count(name, "weight", weights)
                if "weight_grad" in self.kinds:
                    grads = [p.grad for p in params if p.grad is not None]
                    if grads:
                        self._count(name, "weight_grad", _flat(grads))
                if "update" in self.kinds:
                    self._snapshots[name] = weights
        except Exception as err:
            self._fail(err)

    def _on_step_post(self, optimizer, args, kwargs):
        if not self._active:
            return
        try:
            groups = self._params_of(optimizer)
            if not groups:
                return
            if self._sampled and "update" in self.kinds:
                for name, params in groups:
                    before = self._snapshots.pop(name, None)
                    if before is not None:
                        update = _flat(params) - before
                        row, counts = self._count(name, "update", update)
                        if counts is not None:
                            self._store.add_lost(row, self._lost_updates(update, before, counts))
            if not self._forward_since_step:
                return
            self._end_step()
        except Exception as err:
            self._fail(err)
            return
        if self.on_step is not None:
            self.on_step(self.step)

    def advance(self) -> None:
        """End the current step by hand (for loops without a torch.optim optimizer)."""
        self._end_step()

    def _end_step(self) -> None:
        import torch

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if self._sampled:
            self.steps_observed += 1
        self._store.flush(self.step)
        self.step += 1
        self._sampled = self.step % self.every == 0
        self._forward_since_step = False

    # -------------------------------------------------------------- counting
    def _count(self, name: str, kind: str, tensor):
        """Queue a tensor's counts under (name, kind); (row, counts or None when empty)."""
        import torch

        tensor = tensor.detach()
        if tensor.layout != torch.strided:
            tensor = tensor.coalesce().values() if tensor.is_sparse else tensor.to_dense()
        row = self._store.row((name, kind), tensor.device)
        if not tensor.numel():
            return row, None
        counts, low, high = self._counter.count(tensor)
        self._store.add(row, counts, low, high, self.step)
        return row, counts

    def _lost_updates(self, update, before, update_counts):
        """Per format: nonzero updates smaller than half an ulp of their weight (w + u rounds back to w).

        With binades b (2^b <= |x| < 2^(b+1)) the ulp of w in a format with m
        mantissa bits is 2^(max(b_w, emin) - m), so u is lost when b_u <=
        max(b_w, emin) - m - 2. One bincount of the pair (exponent field of w,
        exponent field of u) and a fixed 0/1 matrix give every format at once.
        An update of exactly half an ulp (a tie) counts as kept; float32-subnormal
        updates (below 2^-126) count as lost.
        """
        import torch

        u = update.detach().float().reshape(-1).view(torch.int32)
        w = before.detach().float().reshape(-1).view(torch.int32)
        key = ((w >> 15) & 0xFF00).add_((u >> 23) & 0xFF)
        joint = self._counter._bincount(key, 65536).view(256, 256)
        # lost_f = sum over weight fields g of #{1 <= t <= last_f[g]}: a cumulative sum along t, then a gather
        cumulative = joint.cumsum(dim=1)
        lost = cumulative.gather(1, self._lost_columns(joint.device)).sum(dim=0) - cumulative[:, 0].sum()
        tiny = update_counts[1] + update_counts[513]  # sign 0/1, exponent field 0, mantissa nonzero
        return lost + tiny

    def _lost_columns(self, device):
        """(256, formats) int64: for weight field g, the largest update field t lost in each format
        (0 when none: field 0, zero and subnormal updates, is taken apart)."""
        key = str(device)
        cached = self._lost_matrices.get(key)
        if cached is None:
            import numpy as np
            import torch

            g = np.arange(256)[:, None]
            a = np.array([a for a, _ in self._lost_thresholds])[None, :]
            b = np.array([b for _, b in self._lost_thresholds])[None, :]
            last = np.clip(np.maximum(g, a) - b, 0, 254)        # fields 255 (Inf/NaN) are never lost
            last = np.where(g == 255, 0, last)                    # nor anything next to a non-finite weight
            cached = torch.from_numpy(last.astype(np.int64)).to(device)
            self._lost_matrices[key] = cached
        return cached

    def _params_of(self, optimizer) -> list:
        """[(record name, [parameters])] for the optimizer's parameters that belong to recorded modules."""
        groups = optimizer.param_groups
        size = sum(len(g["params"]) for g in groups)
        cached = self._optimizer_params.get(optimizer)
        if cached is None or cached[0] != size or cached[1] != len(self._param_owner):
            by_module: dict = {}
            for g in groups:
                for p in g["params"]:
                    owner = self._param_owner.get(p)
                    if owner is not None:
                        by_module.setdefault(owner, []).append(p)
            cached = (size, len(self._param_owner), list(by_module.items()))
            self._optimizer_params[optimizer] = cached
        return cached[2]

    # ---------------------------------------------------------------- report
    def report(self, *, underflow_threshold=None, fp8_margin=None, scale_range=None):
        """Statistics and verdicts so far (also mid-run, also after a failure); a `Report`.

        Under torch.distributed every rank must call it (the counts are reduced
        across ranks); Report.save writes on rank 0 only.
        """
        import torch

        from .report import build_report
        from .verdicts import Settings

        settings = Settings.checked(
            self.settings.underflow_threshold if underflow_threshold is None else underflow_threshold,
            self.settings.fp8_margin if fp8_margin is None else fp8_margin,
            self.settings.scale_range if scale_range is None else scale_range)
        self._store.flush(self.step)
        distributed = (torch.distributed.is_available() and torch.distributed.is_initialized()
                       and torch.distributed.get_world_size() > 1)
        snapshot = self._store.snapshot(reduce_across_ranks=distributed, replicated_kinds=REPLICATED_KINDS)
        rank = torch.distributed.get_rank() if distributed else self._rank  # group gone: rank as attached
        world = torch.distributed.get_world_size() if distributed else 1
        elapsed = self.elapsed if not self._active and self.started else (
            time.perf_counter() - self.started if self.started else 0.0)
        run = {
            "status": self.status, "error": self.error, "observation_error": self.observation_error,
            "steps": self.step, "steps_observed": self.steps_observed, "every": self.every,
            "kinds": list(self.kinds), "world_size": world, "seconds": round(elapsed, 3),
        }
        return build_report(snapshot, self.limits, settings, run, dict(self._types), rank=rank)


# ------------------------------------------------------------------ helpers
def _check_kinds(kinds) -> tuple:
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"unknown tensor kind {bad[0]!r}; allowed: {', '.join(KINDS)}" if bad
                         else f"kinds is empty; allowed: {', '.join(KINDS)}")
    return kinds


def _unwrap(model):
    """The module inside DistributedDataParallel / DataParallel wrappers."""
    inner = getattr(model, "module", None)
    if inner is not None and type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
        return inner
    return model


def _label(model) -> str:
    return type(model).__name__


def _flat(tensors, copy: bool = False):
    """One flat tensor holding a module's parameters (or gradients): one count instead of one per tensor."""
    import torch

    parts = [(t.coalesce().values() if t.is_sparse else t).detach().reshape(-1) for t in tensors]
    if len(parts) == 1:
        return parts[0].clone() if copy else parts[0]
    return torch.cat(parts)


def _float_tensors(output, depth: int = 0):
    """The floating-point tensors in a module output (a tensor, or tuples, lists, dicts of them, a few deep)."""
    import torch

    if isinstance(output, torch.Tensor):
        if output.is_floating_point():
            yield output
    elif depth < 4 and isinstance(output, (tuple, list, dict)):
        for item in output.values() if isinstance(output, dict) else output:
            yield from _float_tensors(item, depth + 1)
