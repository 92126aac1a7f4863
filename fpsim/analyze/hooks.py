"""`fpsim.watch`: attach to a training run and count every op's and every layer's tensors on a log2 scale.

Through fpsim.trace, every floating-point tensor an op produces is counted
under its site `Module.name:op`: forward outputs as `activation`, their
gradients, as backward produced them, as `activation_grad`, each in the
dtype it really ran in (autocast). Module outputs of the recorded
modules are counted as before (`activation`, and their gradients through a
hook on the output tensor, never on a leaf); a tensor already counted as an
op output is not counted twice. Parameter hooks count weight gradients as
backward produced them (`weight_grad`, before accumulation, clipping and
unscaling); optimizer step hooks count the weights (`weight`), the gradients
the optimizer used (`optimizer_grad`) and the change it made (`update`).
Under a GradScaler, backward tensors are divided by the scale they carry, so
an AMP run is judged as the same model in FP32. A complex tensor counts as its
real and imaginary parts; a tensor subclass or wrapper as the values it holds
(readable.py), and one whose values cannot be read is left out and noted, while
everything else goes on being counted. With a model given, only its modules are
named: a module outside it (the model's parent, when a submodule is watched)
runs as part of the loop.

Hooks never modify a tensor, never read a value back from a device, and
never raise into the run: the first error is reported with warnings.warn,
observation stops while training (and step counting) goes on.

Steps that are not observed (every=N) cost nothing measurable: between
observed steps the dispatch mode, the module hooks and the parameter hooks
are all removed; one global forward pre-hook, removed when it first fires,
tells that a forward pass ran, and the optimizer hooks count the steps.
A loop that updates the parameters by hand has no optimizer hook: after each
backward, a one-shot forward pre-hook ends the step at the next forward if
the parameters or their gradients changed since (`_on_next_forward`).
"""

from __future__ import annotations

import time
import warnings
import weakref

import numpy as np

from ..trace import OUTSIDE, IdentityMap, ModuleNames, Tracer, unwrap
from .histogram import MASS_SIZE, Log2Counter
from .limits import is_low_precision, resolve_formats
from .nested import float_tensors, is_subclass
from .precision import ScalerWatch, inverse_scale, optimizer_grads_unscaled
from .readable import plain_values, real_parts
from .recipe_probe import DEFAULT_MAX_ELEMENTS, DEFAULT_MAX_TENSORS, RecipeProbe, check_recipe_bounds
from .shadow import ShadowSteps, check_shadow_options
from .signals import Terminated, deferred_signals
from .store import KINDS, Store  # (KINDS: the tensor kinds a watch can record)

DEFAULT_FORMATS = ("fp16", "bf16", "e4m3", "e5m2")
MODULE_PRESETS = ("params", "leaves", "all")
"""modules=: "params" (the default, also None): the modules holding parameters of their own; "leaves":
those, every module without children (activation functions, dropout, ...) and the model itself; "all":
every module."""
REPLICATED_KINDS = ("weight", "optimizer_grad", "update")
"""Identical on every rank under DDP: taken from rank 0, not summed."""
LOW_PRECISION = ("torch.float16", "torch.bfloat16")
COUNTED_CACHE = 256
"""Counts of this many recent tensors are kept, so that a tensor seen again (an op output that is also its
module's output, or a view of it over the same memory, such as a Linear's 3-D output of its 2-D addmm; a gradient
reaching two hooks) is added again without a second pass."""
MAX_OUTPUT_HOOKS = 4096
"""Module outputs with a gradient hook of their own, at most (entries of tensors gone are dropped then)."""
MAX_UNCOUNTED_NAMES = 64
"""Layers and op sites listed per reason in the note on tensors that could not be counted (the counts go on)."""


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
    modules: which modules get a layer entry of their own: "params" (default;
        None too): every module holding parameters of its own; "leaves": those,
        every module without children and the model itself; "all"; or a
        sequence of qualified names (as in model.named_modules(); the model
        itself by its class name) and module types.
    ops: observe every op (default True); False: module outputs only (cheaper).
    every: count steps 0, N, 2N, ... only.
    optimizer: hook this optimizer only (default: any optimizer stepping the
        model's parameters).
    underflow_threshold, fp8_margin, scale_range: what the verdicts tolerate.
    out: a directory; when given, the report is written there when the block
        ends, also when the run raises or is interrupted.
    on_step: called with the step number after each step (progress displays).
    step_capacity: how many per-step gradient amax entries to keep.
    shadow_every: replay every N-th step in each format (shadow steps, see
        fpsim.analyze.shadow) and judge layers by the measured gradient error
        against their noise floor (default None: value counts only).
    shadow_scales: log2 of the candidate loss scales the shadow steps try for
        formats narrower than FP32 (default 0, 8, 16).
    shadow_numerics: how FP16/BF16 shadow steps compute: "emulated"
        (default: autocast's op policy, each op in FP32 rounded once) or
        "autocast" (torch's own low-precision kernels; see docs/verdicts.md).
    recipes_every: on every N-th observed step, quantise each module's
        tensors with every FP8/FP6/FP4 scaling recipe and measure what each
        loses (fpsim.analyze.recipe_probe; default None: not measured).
    recipe_max_elements, recipe_max_tensors: values measured per tensor, and (layer, kind) pairs per
        sampled step (more take turns), on those steps.
    """
    return Watcher(model, formats, **options)


class Watcher:
    """The state of one observation: tracer, hooks, accumulators, step counter."""

    def __init__(self, model, formats=DEFAULT_FORMATS, *, kinds=KINDS, modules=None, ops: bool = True,
                 every: int = 1, optimizer=None, underflow_threshold: float = 1e-3, fp8_margin: int = 0,
                 scale_range=(-32, 64), out=None, on_step=None, step_capacity: int = 65536,
                 shadow_every: int | None = None, shadow_scales=None, shadow_numerics: str = "emulated",
                 recipes_every: int | None = None,
                 recipe_max_elements: int = DEFAULT_MAX_ELEMENTS, recipe_max_tensors: int = DEFAULT_MAX_TENSORS):
        import torch
        from torch.utils.weak import WeakIdKeyDictionary

        self.limits = resolve_formats(formats)
        self.kinds = _check_kinds(kinds)
        check_shadow_options(shadow_scales, shadow_numerics)          # also when no step is shadowed
        check_recipe_bounds(recipe_max_elements, recipe_max_tensors)  # also when no recipe is measured
        self.shadow = None if shadow_every is None else ShadowSteps(self.limits, shadow_every, shadow_scales,
                                                                    shadow_numerics)
        self.recipes = None if recipes_every is None else RecipeProbe(recipes_every, recipe_max_elements,
                                                                      recipe_max_tensors)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int (count every N-th step), got {every!r}")
        if not isinstance(ops, bool):
            raise TypeError(f"ops must be True or False, got {ops!r}")
        from .verdicts import Settings

        self.settings = Settings.checked(underflow_threshold, fp8_margin, scale_range)
        if model is not None and not isinstance(unwrap(model), torch.nn.Module):
            raise TypeError(f"watch() needs a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable, got {on_step!r}")
        self.every, self.ops, self.out, self.on_step = every, ops, _check_out(out), on_step
        self.model = model
        self._optimizer = optimizer
        self._spec = _check_modules(modules)
        self._store = Store(len(self.limits), step_capacity)
        self._counter = Log2Counter()
        self.names = ModuleNames(new_roots=model is None)   # a watched model: modules outside it are the loop's
        self._tracer = Tracer(self, self.names)
        self._recorded = IdentityMap()                  # module -> record name, or None when not recorded
        self._types: dict = {}                          # record name -> module class name, or "op"
        self._hidden: set = set()                       # module records outside the selection (ops compare)
        self._param_owner = WeakIdKeyDictionary()       # parameter -> record name
        self._unplain_owner = WeakIdKeyDictionary()     # parameter that is a tensor subclass -> record name
        self.tied: dict = {}                            # record name -> record names sharing its parameters
        self._shared_with: dict = {}                    # record name -> records sharing the parameters it owns
        self.unplain_params: set = set()                # record names whose parameters are tensor subclasses
        self.low_precision_weights: set = set()         # float16/bfloat16 where trained parameters are kept
        self._grad_params: list = []                    # (weakref to a parameter, record name): weight_grad hooks
        self._param_handles: list = []
        self._counted: dict = {}                        # _cache_key(tensor) -> (weakref, version, unscale,
                                                        #   record, counts, amax, mass): a kernel record, else the rest
        self._dtypes: dict = {}                         # record name -> {torch dtype: tensors}
        self.autocast: dict = {}                        # device type -> autocast dtype seen
        self._optimizer_params = weakref.WeakKeyDictionary()
        self._snapshots: dict = {}
        self._weights_copy = None                        # the buffer the updates' "before" is copied into
        self._handles: list = []
        self._output_hooks: dict = {}                   # (id(tensor), record) -> (weakref, handle): one hook per
                                                        #   module output a tracer node does not carry
        self._scalers = None
        self._scaler = None                              # the GradScaler that scaled this step's backward
        self._inverse_scale = None
        self.step = 0
        self.steps_observed = 0
        self._sampled = True
        self._forward_since_step = False
        self._backward_since_step = False
        self._after_backward = None                      # _parameter_state() at the last backward's end
        self._manual = None                              # the loop updates the parameters without torch.optim:
                                                         #   None not known yet, True, False (an optimizer steps)
        self._closure_step = False                       # inside optimizer.step(closure)
        self._next_forward_hook = None                   # the one-shot forward pre-hook after a backward
        self._stepped_since_update = False
        self._active = False
        self._attached = False
        self._awake = False                              # the hooks of an observed step are in place
        self._forward_hook = None                        # the one-shot forward pre-hook of unobserved steps
        self.status = "running"
        self.error = None
        self.observation_error = None
        self.started = None
        self.elapsed = 0.0
        self.last_report = None
        self.saved_paths: dict = {}
        self.save_error = None
        self._rank, self._world = 0, 1
        if model is not None:
            self._label = type(unwrap(model)).__name__
            self.names.add_root(model, self._label, prefix_label=False)
            self._check_names(unwrap(model))
        self._lost_thresholds = [(lim.emin + 127, lim.fmt.man_bits + 2) for lim in self.limits]
        self._lost_matrices: dict = {}
        self._uncounted: dict = {}                      # why -> {record name: tensors not counted}
        self._uncounted_more: dict = {}                 # why -> tensors of names beyond MAX_UNCOUNTED_NAMES

    # --------------------------------------------------------------- naming
    def _check_names(self, core) -> None:
        """Module names given in modules= must exist in the model, and module types match one of its modules
        (fails at watch(), before training)."""
        if isinstance(self._spec, str) or self._spec is None:
            return
        modules = list(core.named_modules())
        known = {name for name, _ in modules}
        missing = [n for n in self._spec if isinstance(n, str) and n not in known and n != self._label]
        if missing:
            raise ValueError(f"no module named {missing[0]!r} in the model; the modules are: "
                             f"{', '.join(sorted(k for k in known if k))}")
        unmatched = [t for t in self._spec if isinstance(t, type) and not any(isinstance(m, t) for _, m in modules)]
        if unmatched:
            raise ValueError(f"no module of type {unmatched[0].__name__} in the model; its module types are: "
                             f"{', '.join(sorted({type(m).__name__ for _, m in modules}))}")

    def _refresh(self) -> None:
        """Decide, for modules named since last time, whether they get a record (and hook their parameters)."""
        import torch

        pending, self.names.new_names = self.names.new_names, []
        spec = self._spec
        for module, name in pending:
            if type(module).__name__ in ("DistributedDataParallel", "DataParallel", "OptimizedModule",
                                         "FullyShardedDataParallel"):
                self._recorded[module] = None
                if self.shadow is not None and type(module).__name__ == "OptimizedModule" \
                        and unwrap(module) is self.shadow.core:   # torch.compile(model) after watch(model)
                    self.shadow.compiled(module)
                continue
            own = list(module.parameters(recurse=False)) if not isinstance(module, torch.jit.ScriptModule) \
                else []
            if spec is None or spec == "params":
                wanted = bool(own)
            elif spec == "all":
                wanted = True
            elif spec == "leaves":
                wanted = bool(own) or not any(True for _ in module.children()) or self.names.is_root(name)
            else:
                short = name if self.model is not None else name.partition(".")[2]
                wanted = short in spec or name in spec or isinstance(module, tuple(s for s in spec
                                                                                   if isinstance(s, type)))
            if not wanted and not self.ops:
                self._recorded[module] = None
                continue
            self._recorded[module] = name       # with ops, every module's output is kept to compare its ops with
            self._types[name] = type(module).__name__
            if not wanted:
                self._hidden.add(name)
                continue
            self._hidden.discard(name)
            for p in own:
                if is_subclass(p):                       # DTensor (FSDP2 fully_shard) and others
                    self.unplain_params.add(name)
                    self._unplain_owner[p] = name
                    continue
                if p.requires_grad and is_low_precision(p.dtype):
                    self.low_precision_weights.add(str(p.dtype).removeprefix("torch."))
                owner = self._param_owner.get(p)
                if owner is not None:
                    self.tied.setdefault(owner, []).append(name)
                    self.tied.setdefault(name, []).append(owner)
                    sharers = self._shared_with.setdefault(owner, [])
                    if name not in sharers:
                        sharers.append(name)
                    continue
                self._param_owner[p] = name
                if "weight_grad" in self.kinds and p.requires_grad:
                    self._grad_params.append((weakref.ref(p), name))
                    if self._awake:
                        self._param_handles.append(p.register_hook(self._param_grad_hook(name)))

    # --------------------------------------------------------- attach/detach
    def attach(self) -> "Watcher":
        import torch
        from torch.optim import optimizer as optim_module

        if self._attached:
            raise RuntimeError("this watch is already attached; a Watcher observes one run")
        self._attached = True
        try:
            self.started = time.perf_counter()
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()
            self._refresh()
            if self.shadow is not None and self.model is not None:
                self._attach_shadow(self.model)
            self._tracer.attach()
            if self._optimizer is not None:
                self._handles += [self._optimizer.register_step_pre_hook(self._on_step_pre),
                                  self._optimizer.register_step_post_hook(self._on_step_post)]
            else:
                self._handles += [optim_module.register_optimizer_step_pre_hook(self._on_step_pre),
                                  optim_module.register_optimizer_step_post_hook(self._on_step_post)]
            self._scalers = ScalerWatch(self)
            self._active = True
            self._wake(True)
        except BaseException:
            self.close()
            raise
        return self

    def _wake(self, on: bool) -> None:
        """Put the hooks of an observed step in place (on), or take them all away until the next one."""
        import torch.nn.modules.module as nn_module

        self._awake = on
        self._tracer.modules(on)
        self._tracer.intercept(on and self.ops)
        if on:
            self._drop_forward_hook()
            if not self._param_handles:
                for ref, name in self._grad_params:
                    p = ref()
                    if p is not None:
                        self._param_handles.append(p.register_hook(self._param_grad_hook(name)))
        else:
            for handle in self._param_handles:
                handle.remove()
            self._param_handles = []
            if self._forward_hook is None and self._active:
                self._forward_hook = nn_module.register_module_forward_pre_hook(self._on_first_forward)

    def backward_done(self) -> None:
        """A backward pass of the run ended, before anything updates the parameters (Tracer.backward_done).

        Where no optimizer.step() comes before the update (a closure's backward inside step(), parameters
        updated by hand), the shadow step is replayed here. Until an optimizer steps, the next forward after a
        backward may mean that the loop updates by hand (_on_next_forward)."""
        if not self._active:
            return
        try:
            if self.shadow is not None and (self._manual or self._closure_step):
                self.shadow.before_step(self._inverse_scale)
            if self._manual and self._sampled and not self._backward_since_step:
                with self._tracer.busy():             # the weights as the forward used them, before the update
                    self._count_before_update(self._manual_groups())
            if self._manual is not False:
                self._backward_since_step = True
                self._after_backward = self._parameter_state()
                if self._next_forward_hook is None:
                    import torch.nn.modules.module as nn_module

                    self._next_forward_hook = nn_module.register_module_forward_pre_hook(self._on_next_forward)
        except Exception as err:
            self._fail(err)

    def _parameter_state(self) -> list:
        """What an update by hand changes: each parameter's version (in-place updates under no_grad) and its
        gradient (set to None, replaced or zeroed). Gradient accumulation changes neither between backwards."""
        return [(p._version, None if p.grad is None else (id(p.grad), p.grad._version))
                for p in self._param_owner.keys()]

    def _on_next_forward(self, module, args):
        """The first module call after a backward with no optimizer step between: if the parameters or their
        gradients changed since (not gradient accumulation), the loop updates by hand (PyTorch's
        word_language_model, makemore): the step ends here, and steps end so on."""
        self._drop_next_forward()
        if not self._active or self._manual is False or not self._backward_since_step:
            return
        if self._parameter_state() == self._after_backward:    # micro-batches accumulating gradients
            return
        self._manual = True
        hooked = self._awake
        try:
            self._end_manual_step()
            if self._awake and not hooked:     # the tracer's pre-hook came too late for this call
                self._tracer._on_pre(module, args)
        except Exception as err:
            self._fail(err)
        if self.on_step is not None:
            self.on_step(self.step)            # (may raise StopRun: --steps)

    def _end_manual_step(self) -> None:
        """End a step of a loop that updates by hand: its updates (if its weights were copied), then the step."""
        if self._snapshots:
            with self._tracer.busy():
                self._count_optimizer_side(None, self._manual_groups())
        self._end_step()

    def _manual_groups(self) -> list:
        """[(record name, [parameters])] of every recorded module's trainable parameters (no optimizer's list)."""
        return self._by_owner(p for p in self._param_owner.keys() if p.requires_grad)

    def _drop_next_forward(self) -> None:
        if self._next_forward_hook is not None:
            self._next_forward_hook.remove()
            self._next_forward_hook = None

    def _on_first_forward(self, module, args):
        """An unobserved step's first module call: a forward pass ran (the step may end)."""
        self._forward_since_step = True
        self._drop_forward_hook()

    def _drop_forward_hook(self) -> None:
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def close(self) -> None:
        """Detach every hook and the op interception (idempotent); the counts stay for report()."""
        if self._active and self._manual and self._backward_since_step:   # a loop updating by hand: its last step
            try:
                self._end_manual_step()
            except Exception as err:
                self._fail(err)
        self._drop_next_forward()
        self._active = False
        self._wake(False)
        self._drop_forward_hook()
        self._tracer.close()
        if self.shadow is not None:
            self.shadow.close()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for _, handle in self._output_hooks.values():
            handle.remove()
        self._output_hooks = {}
        if self._scalers is not None:
            self._scalers.restore()
        self._snapshots.clear()
        self._counted = {}
        if self.started is not None and self._attached:
            self.elapsed = time.perf_counter() - self.started

    def __enter__(self) -> "Watcher":
        return self.attach()

    def __exit__(self, exc_type, exc, tb) -> bool:
        with deferred_signals():          # a second Ctrl-C or a SIGTERM waits until the report is written
            self.close()
            self.status, self.error = run_status(exc_type, exc)
            if self.out is not None:
                self.write_report(self.out)
        return False

    def write_report(self, out) -> dict:
        """Build and save the report into `out` (report.json first); {} and `save_error` set when it failed."""
        try:
            self.last_report = self.report()
            self.saved_paths = self.last_report.save(out)
        except Exception as err:  # never mask the run's own end
            self.save_error = f"{type(err).__name__}: {err}"
            self.saved_paths = getattr(err, "written", {})
            warnings.warn(f"fpsim.watch: could not write the whole report to {out}: {self.save_error}",
                          RuntimeWarning)
        return self.saved_paths

    def _fail(self, err: BaseException) -> None:
        """First error inside a hook: say so once, stop observing, let training (and step counting) go on."""
        if not self._active:
            return
        self._active = False
        self.observation_error = f"{type(err).__name__}: {err}"
        warnings.warn(f"fpsim.watch: observation stopped after an error in its hook ({self.observation_error}); "
                      f"training continues unobserved", RuntimeWarning, stacklevel=3)
        self._wake(False)
        self._drop_forward_hook()
        self._snapshots.clear()

    # ------------------------------------------------------- tracer client
    def forward_op(self, site, outputs):
        if not self._active or not self._sampled or "activation" not in self.kinds:
            return None
        try:
            import torch

            if not torch.is_grad_enabled() or not self._tracer.module_grad():
                return None
            if site.module == OUTSIDE and not self._forward_since_step:
                return None                       # before the model ran: data preparation, not training
            name = site.name
            if name not in self._types:
                self._types[name] = "op"
            seen = self._dtypes.get(name)
            if seen is None:
                seen = self._dtypes[name] = {}
            in_place = site.op.endswith("_")   # (aten's in-place ops: torch bumps the version after this)
            for t in outputs:
                if self._count(name, "activation", t, cached=not in_place)[0] is not None:   # (None: unreadable)
                    seen[t.dtype] = seen.get(t.dtype, 0) + 1
        except Exception as err:
            self._fail(err)
        return None

    def output_grad(self, site, grads):
        if not self._active or not self._sampled or "activation_grad" not in self.kinds:
            return
        try:
            for g in grads:
                self._count(site.name, "activation_grad", g, unscale=True)
        except Exception as err:
            self._fail(err)

    def tagged_grad(self, record, grad):
        """The gradient of a module output (tagged with its record by `module_output`)."""
        if self._active and self._sampled:
            try:
                self._count(record, "activation_grad", grad, unscale=True)
            except Exception as err:
                self._fail(err)

    def module_output(self, name, module, output):
        if not self._active:
            return
        try:
            import torch

            self._forward_since_step = True
            if self.names.new_names:
                self._refresh()
            if self.shadow is not None:
                if self.shadow.wants_root and self.names.is_root(name):
                    self._attach_shadow(module)
                elif self.shadow.may_retarget and self._tracer.outermost() and torch.is_grad_enabled():
                    self.shadow.ran_outermost(module)
            record = self._recorded.get(module)
            if record is None or not self._sampled or not torch.is_grad_enabled():
                return
            if torch._C._is_any_autocast_enabled():
                self._note_autocast()
            tensors = (output,) if type(output) is torch.Tensor else float_tensors(output)
            for t in tensors:
                if not t.is_floating_point() and not t.is_complex():
                    continue
                if "activation" in self.kinds:
                    self._count(record, "activation", t)
                if "activation_grad" in self.kinds and t.requires_grad and t.grad_fn is not None \
                        and not self._tracer.hook_output(t, record):    # an op's output: its node's pre-hook
                    self._hook_output(t, record)
        except Exception as err:
            self._fail(err)

    def _attach_shadow(self, model) -> None:
        """Give the shadow steps their root: the model, or (model=None) the first root with parameters to run."""
        if any(True for _ in unwrap(model).parameters()):
            self.shadow.attach(model, unwrap(model), self.names.get, self._tracer.busy, lambda: self.step)

    def _note_autocast(self) -> None:
        import torch

        for device in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device):
                self.autocast[device] = str(torch.get_autocast_dtype(device)).replace("torch.", "")

    # ---------------------------------------------------------------- hooks
    def _hook_output(self, tensor, record: str) -> None:
        """A gradient hook on a module output that no op of this step made (a tensor a module keeps and returns
        again, say): once per tensor and record, however often it is returned; removed at close, and
        forgotten with the tensor."""
        key = (id(tensor), record)
        hooked = self._output_hooks.get(key)
        if hooked is not None and hooked[0]() is tensor:
            return
        if len(self._output_hooks) >= MAX_OUTPUT_HOOKS:       # drop the entries of tensors gone
            self._output_hooks = {k: v for k, v in self._output_hooks.items() if v[0]() is not None}
        self._output_hooks[key] = (weakref.ref(tensor), tensor.register_hook(self._gradient_hook(record)))

    def _gradient_hook(self, name: str):
        return self._tensor_hook(name, "activation_grad")

    def _param_grad_hook(self, name: str):
        return self._tensor_hook(name, "weight_grad")

    def _tensor_hook(self, name: str, kind: str):
        """A gradient hook on a tensor of the run, counting on sampled steps (not in a shadow replay's backward,
        which runs through the same tensors when a module returns one it keeps)."""
        def on_gradient(grad):
            if self._active and self._sampled and not self._tracer.is_busy():
                try:
                    self._count(name, kind, grad, unscale=True)
                except Exception as err:
                    self._fail(err)
        return on_gradient

    def _on_scale(self, scaler) -> None:
        """A GradScaler scaled a loss: this step's backward tensors carry its scale."""
        if not self._active:
            return
        try:
            with self._tracer.busy():
                self._scaler = weakref.ref(scaler)
                self._inverse_scale = inverse_scale(scaler)
        except Exception as err:
            self._fail(err)

    def _on_scaler_update(self, record, scale: float, skipped: bool) -> None:
        """GradScaler.update: the step ends here when the scaler skipped optimizer.step() (recorded first: a run
        stopped at that step's end still has it)."""
        ends_here = skipped and self._forward_since_step and not self._stepped_since_update
        record.record(self.step if ends_here else self.step - 1, scale, skipped)
        self._stepped_since_update = False
        if ends_here:
            self._end_step()
            if self.on_step is not None:
                self.on_step(self.step)

    def _on_step_pre(self, optimizer, args, kwargs):
        if not self._active:
            return
        self._manual = False
        self._drop_next_forward()
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)   # args: (optimizer, ...)
        self._closure_step = closure is not None   # its forward and backward run inside step(): replayed at the
        if closure is None:                  # backward's end. The step's own arithmetic is not the model's: no
            self._tracer.intercept(False)    # interception (nor the shadow replay's, which would pay op by op)
        if self.shadow is not None:          # before the step: the parameters are still those of the forward
            self.shadow.before_step(self._inverse_scale)
        try:
            with self._tracer.busy():
                groups = self._params_of(optimizer)
                if groups and self._sampled:
                    self._count_before_update(groups)
        except Exception as err:
            self._fail(err)

    def _count_before_update(self, groups) -> None:
        """The weights as the forward used them, and their copy that the updates are measured against."""
        if self._recipe_step():          # parameter by parameter
            for name, params in groups:
                for p in params:
                    self._probe_recipes(name, "weight", p)
        if self._counter.kernel and all(_plain_f32(p) for _, params in groups for p in params):
            self._count_weights_on_host(groups)
            return
        for name, params in groups:
            weights = _flat(params, copy="update" in self.kinds)  # the copy is the update's "before"
            if "weight" in self.kinds:
                self._count(name, "weight", weights)
            if "update" in self.kinds:
                self._snapshots[name] = (params, weights, 0)

    def _count_weights_on_host(self, groups) -> None:
        """One copy of every parameter (the updates' "before"), counted module by module by the kernel in one
        call. The copy goes into the same buffer every sampled step (a fresh one of a large model's size
        costs more in page faults than the copy itself)."""
        import torch

        parts = [p.detach().reshape(-1) for _, params in groups for p in params]
        total = sum(part.numel() for part in parts)
        if self._weights_copy is None or self._weights_copy.numel() != total:
            self._weights_copy = torch.empty(total, dtype=torch.float32)
        flat = torch.cat(parts, out=self._weights_copy)
        address, offset, items = flat.data_ptr(), 0, []
        for name, params in groups:
            n = sum(p.numel() for p in params)
            if "weight" in self.kinds and n:
                items.append((self._store.row(name, "weight", flat), ((address + 4 * offset, n),)))
            if "update" in self.kinds:
                self._snapshots[name] = (params, flat, offset)
            offset += n
        if items:
            self._store.count_rows(tuple(items), 0, self.step)

    def _on_step_post(self, optimizer, args, kwargs):
        self._stepped_since_update = True
        self._closure_step = False
        scaler = self._scaler() if self._scaler is not None else None   # (the step's end forgets it)
        if self._active:
            self._tracer.intercept(self.ops and self._awake)
        if not self._active:                     # observation stopped: steps still count (--steps holds)
            if self._attached and self.observation_error is not None:
                self.step += 1
                if self.on_step is not None:
                    self.on_step(self.step)
            return
        try:
            with self._tracer.busy():
                groups = self._params_of(optimizer)
                if not groups and not self._steps_unplain(optimizer):
                    return
                if self._sampled:
                    self._count_optimizer_side(optimizer, groups)
                if not self._forward_since_step:
                    return
                self._end_step()
        except Exception as err:
            self._fail(err)
            self.step += 1
        if self.on_step is not None:
            try:
                self.on_step(self.step)
            except StopRun:        # the run ends inside GradScaler.step: its update() will not run, record it here
                if scaler is not None and self._scalers is not None:
                    self._scalers.observe_update(self, scaler)
                raise

    def _count_optimizer_side(self, optimizer, groups) -> None:
        """Gradients as the optimizer used them (read after the step: closures have run) and the updates
        (optimizer None: an update by hand, whose gradients may be gone by now: the updates only)."""
        import torch

        scaler = self._scaler() if self._scaler is not None else None
        scaled = scaler is not None and optimizer is not None and not optimizer_grads_unscaled(scaler, optimizer)
        grad_items, grad_samples, update_items = [], [], []   # what the kernel counts in one call each
        befores = []                                          # the copies update_items point into, kept alive
        for name, params in groups:
            if "optimizer_grad" in self.kinds and optimizer is not None:
                grads = [p.grad for p in params if p.grad is not None]
                if not scaled and self._counter.kernel and grads and all(_plain_f32(g) for g in grads):
                    parts = tuple((g.data_ptr(), g.numel()) for g in grads)
                    if any(n for _, n in parts):
                        grad_items.append((self._store.row(name, "optimizer_grad", grads[0]), parts))
                        grad_samples.append(len(grads))
                else:
                    for g in grads:
                        self._count(name, "optimizer_grad", g, unscale=scaled)
            snapshot = self._snapshots.pop(name, None)
            if snapshot is None:
                continue
            params, before, offset = snapshot    # the parameters in the order they were copied
            if self._counter.kernel and all(_plain_f32(p) for p in params) and _plain_f32(before):
                parts = tuple((p.data_ptr(), p.numel()) for p in params)   # updates: params now - before
                if any(n for _, n in parts):
                    update_items.append((self._store.row(name, "update", before), before.data_ptr() + 4 * offset,
                                         parts))
                    befores.append(before)
                continue
            now = _flat(params)
            before = before.narrow(0, offset, now.numel())
            wide = torch.promote_types(now.dtype, torch.float32)    # 16-bit weights: their update in float32,
            update = now.to(wide) - before.to(wide)                 # not rounded to their own format again
            row, counts = self._count(name, "update", update)
            if counts is not None:
                self._store.add_lost(row, self._lost_updates(update, before))
        if grad_items:
            self._store.count_rows(tuple(grad_items), 0, self.step, samples=grad_samples)
        if update_items:
            self._store.count_updates(tuple(update_items), self._lost_table(np.int32), self.step)

    def advance(self) -> None:
        """End the current step by hand (a loop whose update the watcher cannot see: docs/analyzer.md, Limits)."""
        self._end_step()

    def _end_step(self) -> None:
        import torch

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if self._sampled:
            self.steps_observed += 1
        if self.recipes is not None:
            self.recipes.end_step(self.step, self._recipe_step())
        with self._tracer.busy():
            self._store.flush(self.step)
        self._counted = {}
        self._tracer.forget_graph()
        if self.shadow is not None:
            self.shadow.step_ended()
        self._scaler = self._inverse_scale = None
        self.step += 1
        self._sampled = self.step % self.every == 0
        self._forward_since_step = self._backward_since_step = False
        if self._active:
            self._wake(self._sampled)

    # -------------------------------------------------------------- counting
    def _count(self, name: str, kind: str, tensor, unscale: bool = False, cached: bool = True):
        """Add a tensor's counts and mass (none for updates) to (name, kind); (row, counts or None when empty), or
        (None, None) for a tensor that cannot be read (noted: readable.plain_values).

        A complex tensor counts as its real and imaginary parts (two values per element).
        unscale: divide by the scale a GradScaler put on this step's backward (exact for powers of two).
        A tensor counted a moment ago and unchanged since (the same object, or
        a view of the same base over the same memory, at the same version) is
        added again from its counts, unless `cached` is False (the output of an
        in-place op, whose version torch bumps only after it).
        """

        key = _cache_key(tensor) if tensor.__class__ in self._counter.plain else None
        if key is None:      # a tensor subclass (DTensor, nested), or a tensor without storage (vmap's, torch.func's)
            tensor, why = plain_values(tensor)
            if tensor is None:
                self._note_uncounted(name, why)
                return None, None
            key = _cache_key(tensor)
        if self.recipes is not None and kind != "weight" and self._recipe_step():   # weights: _on_step_pre
            self._probe_recipes(name, kind, tensor, unscale)
        store = self._store
        row = store.index.get(kind, _NO_ROWS).get(name)
        if row is None:
            row = store.row(name, kind, tensor)
        version = tensor._version
        seen = self._counted.get(key) if cached else None
        if seen is not None and seen[2] == unscale and _same_values(seen[0](), tensor, seen[1]):
            record, counts, amax, mass = seen[3:]
            if record is not None:
                store.add_record(row, record, amax, self.step)
            else:
                store.add(row, counts, amax, self.step, mass=mass)
            return row, record if record is not None else counts
        with_mass = kind != "update"
        record = counts = mass = None
        if store.on_host and not (unscale and self._inverse_scale is not None) and self._counter.on_host(tensor):
            n = tensor.numel()          # the kernel reads the tensor as it is and adds it to the row at once
            if not n:
                return row, None
            amax, record = store.count_into(row, tensor.data_ptr(), n, self._counter.kind_of(tensor), self.step,
                                            with_mass)
        else:
            counts, amax, mass = self._counts_of(tensor, unscale and self._inverse_scale is not None)
            if counts is None:
                return row, None
            store.add(row, counts, amax, self.step, mass=mass if with_mass else None)
        if with_mass and cached:        # (updates are fresh tensors: never seen again)
            try:
                self._counted[key] = (weakref.ref(tensor), version, unscale, record, counts, amax, mass)
                if len(self._counted) > COUNTED_CACHE:
                    del self._counted[next(iter(self._counted))]
            except TypeError:   # a tensor type without weak references: not kept
                pass
        return row, record if record is not None else counts

    def _note_uncounted(self, name: str, why: str) -> None:
        """A tensor of `name` that cannot be read (readable.plain_values) is left out; the report's notes say
        where and why (at most MAX_UNCOUNTED_NAMES names per reason; the number of tensors covers them all)."""
        names = self._uncounted.get(why)
        if names is None:
            names = self._uncounted[why] = {}
        if name in names or len(names) < MAX_UNCOUNTED_NAMES:
            names[name] = names.get(name, 0) + 1
        else:
            self._uncounted_more[why] = self._uncounted_more.get(why, 0) + 1

    def _recipe_step(self) -> bool:
        return self.recipes is not None and self._sampled and self.recipes.wants(self.step)

    def _probe_recipes(self, name: str, kind: str, tensor, unscale: bool = False) -> None:
        """Hand a recorded module's tensor to the recipe probe (op sites and modules outside the selection are
        not judged)."""
        if self._types.get(name, "op") != "op" and name not in self._hidden:
            with self._tracer.busy():
                self.recipes.observe(name, kind, tensor, self._inverse_scale if unscale else None)

    def _counts_of(self, tensor, unscale: bool):
        """(counts, amax, mass) of a tensor, Nones when it is empty; unscale: divide by the GradScaler's scale."""
        import torch

        if not unscale and self._counter.on_host(tensor):   # the kernel reads the tensor as it is
            mass = np.zeros(MASS_SIZE)
            amax, pairs = self._counter.count_pairs(tensor, mass)
            return (pairs, amax, mass) if pairs else (None, None, None)
        with self._tracer.busy():
            tensor = tensor.detach()
            if tensor.layout != torch.strided:
                tensor = tensor.coalesce().values() if tensor.is_sparse else tensor.to_dense()
            if not tensor.numel():
                return None, None, None
            if tensor.is_complex():       # each part a value, as complex32 stores each part in FP16
                tensor = real_parts(tensor)
            if unscale:
                tensor = tensor.float() * self._inverse_scale.to(tensor.device)
            elif not tensor.is_contiguous():
                tensor = tensor.contiguous()
            if self._counter.on_host(tensor):
                mass = np.zeros(MASS_SIZE)
                amax, pairs = self._counter.count_pairs(tensor, mass)
                return pairs, amax, mass
            return self._counter.count(tensor, mass=True)

    def _lost_updates(self, update, before):
        """Per format: nonzero updates smaller than half an ulp of their weight (w + u rounds back to w).

        With binades b (2^b <= |x| < 2^(b+1)) the ulp of w in a format with m
        mantissa bits is 2^(max(b_w, emin) - m), so u is lost when b_u <=
        max(b_w, emin) - m - 2. One bincount of the pair (exponent field of w,
        exponent field of u) and a fixed 0/1 matrix give every format at once.
        An update of exactly half an ulp (a tie) counts as kept; float32-subnormal
        updates (below 2^-126) count as lost. A complex weight and its update pair
        part with part.
        """
        import torch

        u = real_parts(update.detach()).float().reshape(-1).view(torch.int32)
        w = real_parts(before.detach()).float().reshape(-1).view(torch.int32)
        key = ((w >> 15) & 0xFF00).add_((u >> 23) & 0xFF)
        joint = self._counter._bincount(key, 65536).view(256, 256)
        # lost_f = sum over weight fields g of #{1 <= t <= last_f[g]}: a cumulative sum along t, then a gather
        cumulative = joint.cumsum(dim=1)
        lost = cumulative.gather(1, self._lost_columns(joint.device)).sum(dim=0) - cumulative[:, 0].sum()
        tiny = (joint[:, 0].sum() - ((u & 0x7FFFFFFF) == 0).sum())   # exponent field 0 but not zero: subnormal
        return lost + tiny

    def _lost_table(self, dtype=np.int64) -> np.ndarray:
        """(256, formats): for weight field g, the largest update field t lost in each format (0 when none:
        field 0, zero and subnormal updates, is taken apart)."""
        cached = self._lost_matrices.get(dtype)
        if cached is None:
            g = np.arange(256)[:, None]
            a = np.array([a for a, _ in self._lost_thresholds])[None, :]
            b = np.array([b for _, b in self._lost_thresholds])[None, :]
            last = np.clip(np.maximum(g, a) - b, 0, 254)        # fields 255 (Inf/NaN) are never lost
            last = np.where(g == 255, 0, last)                    # nor anything next to a non-finite weight
            cached = self._lost_matrices[dtype] = np.ascontiguousarray(last, dtype=dtype)
        return cached

    def _lost_columns(self, device):
        """`_lost_table` as an int64 tensor on `device`."""
        key = str(device)
        cached = self._lost_matrices.get(key)
        if cached is None:
            import torch

            cached = self._lost_matrices[key] = torch.from_numpy(self._lost_table()).to(device)
        return cached

    def _params_of(self, optimizer) -> list:
        """[(record name, [parameters])] for the optimizer's parameters that belong to recorded modules."""
        return self._optimizer_view(optimizer)[0]

    def _steps_unplain(self, optimizer) -> bool:
        """Whether the optimizer steps parameters of the model that are tensor subclasses (DTensor: FSDP's
        fully_shard): not counted, but its steps are the run's steps."""
        return self._optimizer_view(optimizer)[1]

    def _optimizer_view(self, optimizer) -> tuple:
        """(`_params_of`, `_steps_unplain`) of the optimizer, worked out again only when its parameter list or
        the recorded parameters changed."""
        if self.names.new_names:
            self._refresh()
        groups = optimizer.param_groups
        key = (sum(len(g["params"]) for g in groups), len(self._param_owner), len(self._unplain_owner))
        cached = self._optimizer_params.get(optimizer)
        if cached is None or cached[0] != key:
            params = [p for g in groups for p in g["params"]]
            cached = (key, (self._by_owner(params), any(p in self._unplain_owner for p in params)))
            self._optimizer_params[optimizer] = cached
        return cached[1]

    def _by_owner(self, params) -> list:
        """[(record name, [parameters])]: `params` that belong to recorded modules, grouped by module."""
        by_module: dict = {}
        for p in params:
            owner = self._param_owner.get(p)
            if owner is not None:
                by_module.setdefault(owner, []).append(p)
        return list(by_module.items())

    # ---------------------------------------------------------------- report
    def precision(self) -> dict:
        """What the run computed in: autocast dtypes, ops per dtype, and what every real GradScaler did."""
        ops: dict = {}
        for name, dtypes in self.dtypes().items():
            for dtype, n in dtypes.items():
                ops[dtype.replace("torch.", "")] = ops.get(dtype.replace("torch.", ""), 0) + n
        scalers = [r.to_dict() for r in self._scalers.records.values()] if self._scalers is not None else []
        return {"autocast": dict(self.autocast), "op_outputs_by_dtype": ops, "grad_scalers": scalers,
                "unscaled": bool(scalers)}

    def dtypes(self) -> dict:
        """{record name: {dtype name ('torch.float16'): tensors counted in it}}."""
        return {name: {str(dtype): n for dtype, n in seen.items()} for name, seen in self._dtypes.items()}

    def notes(self) -> list:
        """What could not be observed, or needs saying, in words."""
        notes = []
        for name in sorted(set(self.names.compiled)):
            notes.append(f"{name} ran under torch.compile: its fused kernels are not seen; only the library "
                         f"kernels compiled code calls (matmuls) are, attributed to {name}, and module outputs "
                         f"inside it are not recorded")
        for name in sorted(set(self.names.scripted)):
            notes.append(f"{name} is TorchScript: its ops are attributed to {name} itself; its submodules are not "
                         f"seen separately and get no hooks")
        for owner, sharers in self._shared_with.items():     # one note per module owning shared parameters
            notes.append(f"tied weights: {', '.join(sorted({owner, *sharers}))} share parameters; they are counted "
                         f"once, under {owner}")
        if self.low_precision_weights and "update" in self.kinds:
            stored = " and ".join(sorted(self.low_precision_weights))
            notes.append(f"weights are stored in {stored}: an update the run lost is zero there and is not counted, "
                         f"so the lost-update shares are lower bounds, and say nothing of {stored} itself (with "
                         f"FP32 master weights they would be counted)")
        if self.unplain_params:
            names = sorted(self.unplain_params)
            notes.append(f"{', '.join(names[:5])}{' and others' if len(names) > 5 else ''} hold parameters that "
                         f"are tensor subclasses (DTensor: FSDP2's fully_shard, tensor parallelism): their weights, "
                         f"weight gradients and updates are not observed")
        for why, names in self._uncounted.items():
            listed = sorted(names)
            more = self._uncounted_more.get(why, 0)
            tensors = sum(names.values()) + more
            notes.append(f"{tensors} tensor{'s' if tensors != 1 else ''} of {', '.join(listed[:5])}"
                         f"{f' and {len(listed) - 5} more' if len(listed) > 5 else ''}"
                         f"{' and others' if more else ''} not counted: {why}")
        if self._tracer.error is not None:
            notes.append(f"module naming failed once: {self._tracer.error}")
        if self.shadow is not None:
            notes.extend(self.shadow.describe())
        return notes

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
        with self._tracer.busy():
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
            "kinds": list(self.kinds), "ops": self.ops, "world_size": world, "seconds": round(elapsed, 3),
            "precision": self.precision(), "notes": self.notes(),
        }
        if getattr(self, "_label", None):   # the watched model's class (else the report guesses from its records)
            run["model"] = self._label
        dtypes = {name: {k.replace("torch.", ""): v for k, v in d.items()} for name, d in self.dtypes().items()}
        shadow = self.shadow.evidence() if self.shadow is not None and self.shadow.record.count \
            and not self.shadow.overridden else None
        recipes = None if self.recipes is None else (self.recipes.measurements(), self.recipes.describe())
        return build_report(snapshot, self.limits, settings, run, dict(self._types), rank=rank, dtypes=dtypes,
                            tied={k: sorted(set(v)) for k, v in self.tied.items()}, hidden=set(self._hidden),
                            shadow=shadow, recipes=recipes)


# ------------------------------------------------------------------ helpers
def run_status(exc_type, exc) -> tuple:
    """(status, error) of a run that ended with this exception (None: completed)."""
    if exc_type is None:
        return "completed", None
    if issubclass(exc_type, KeyboardInterrupt):
        return "interrupted", "KeyboardInterrupt"
    if issubclass(exc_type, StopRun):
        return "stopped", None
    if issubclass(exc_type, Terminated):
        return "terminated", "SIGTERM"
    if issubclass(exc_type, SystemExit):
        code = getattr(exc, "code", None)
        if code in (None, 0):
            return "completed", None
        return "error", f"SystemExit: {code}"
    return "error", f"{exc_type.__name__}: {exc}"


def _check_kinds(kinds) -> tuple:
    if isinstance(kinds, str):
        kinds = (kinds,)
    kinds = tuple(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise ValueError(f"unknown tensor kind {bad[0]!r}; allowed: {', '.join(KINDS)}" if bad
                         else f"kinds is empty; allowed: {', '.join(KINDS)}")
    return kinds


def _check_modules(spec):
    """modules=: None, a preset, or a list of names and torch.nn.Module types."""
    import torch

    if spec is None or spec in MODULE_PRESETS:
        return spec
    if isinstance(spec, (str, type)):
        spec = [spec]
    if not isinstance(spec, (list, tuple, set, frozenset)):
        raise TypeError(f"modules must be one of {', '.join(MODULE_PRESETS)}, a module name or type, or a "
                        f"sequence of them; got {type(spec).__name__} {spec!r}")
    if not spec:
        raise ValueError(f"modules is empty; give one of {', '.join(MODULE_PRESETS)}, or qualified names and module "
                         f"types of the modules to record")
    bad = [s for s in spec if not isinstance(s, (str, type))]
    if bad:
        raise TypeError(f"modules holds {bad[0]!r}; give qualified names (str) or module types")
    bad_types = [t for t in spec if isinstance(t, type) and not issubclass(t, torch.nn.Module)]
    if bad_types:
        raise TypeError(f"modules holds {bad_types[0]!r}, which is not a torch.nn.Module type")
    return tuple(spec)


def _check_out(out):
    """out=: None, or a folder path (str or os.PathLike) that is not an existing file."""
    import os

    if out is None:
        return None
    if not isinstance(out, (str, os.PathLike)) or not isinstance(os.fspath(out), str):
        raise TypeError(f"out must be a folder path (str or os.PathLike) or None, got {type(out).__name__} {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise ValueError(f"out {os.fspath(out)!r} is an existing file, not a folder; give a folder for the report")
    return out


def _plain_f32(t) -> bool:
    """A plain, dense, contiguous float32 CPU tensor (what the compiled update counter reads)."""
    if not _PLAIN:
        import torch

        _PLAIN.extend(((torch.Tensor, torch.nn.Parameter), torch.float32, torch.strided))
    plain, float32, strided = _PLAIN   # (runs for every parameter and gradient of a step: attributes that cost least)
    return (t.__class__ in plain and t.dtype is float32 and t.is_cpu and t.layout is strided and t.is_contiguous()
            and not t.is_neg())


_PLAIN: list = []
"""What _plain_f32 compares with, once torch is imported."""
_NO_ROWS: dict = {}
"""The rows of a kind not recorded yet: none."""


def _flat(tensors, copy: bool = False):
    """One flat tensor holding a module's parameters (or gradients): one count instead of one per tensor."""
    import torch

    parts = [(t.coalesce().values() if t.is_sparse else t).detach().reshape(-1) for t in tensors]
    if len(parts) == 1:
        return parts[0].clone() if copy else parts[0]
    return torch.cat(parts)


def _cache_key(tensor):
    """The counts cache's key: a plain contiguous tensor's memory (a view of it over the same bytes holds the
    same values), else the object itself (sparse layouts; tensor subclasses, whose data_ptr need not be
    their values'); None for a plain tensor without storage (functorch's wrappers, the meta device:
    readable.plain_values)."""
    import torch

    if type(tensor) is torch.Tensor and tensor.layout == torch.strided:
        try:
            address = tensor.data_ptr()
        except RuntimeError:        # no storage: inside torch.vmap or torch.func.grad
            return None
        if not address and tensor.numel():   # no memory of its own (the meta device)
            return None
        if tensor.is_contiguous():
            return address, tensor.numel(), tensor.dtype, tensor.device
    return id(tensor)


def _same_values(original, tensor, version: int) -> bool:
    """Whether `tensor` holds the values `original` (None: gone) had when it was counted at `version`: the same
    tensor, or a view of the same base (views share one version counter), not written since."""
    if original is None or (original is not tensor and _base_of(original) is not _base_of(tensor)):
        return False
    return tensor._version == version


def _base_of(tensor):
    return tensor._base if tensor._base is not None else tensor
