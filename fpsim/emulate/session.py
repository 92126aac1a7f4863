"""fpsim.emulate(model, recipe, ...): the user's training loop, run in a recipe's numerics.

While the block runs, and only then:

* torch.autocast is on for the model's device type with the recipe's low format (its weight
  cache off, so that every step casts the current FP32 master weights), applying the op
  policy of `policy`'s device type (`fpsim.emulate.autocast`); it is off during backward
  passes and optimizer steps, as in an AMP loop that autocasts its forward pass and loss;
* every op on fp16/bf16 tensors computes in FP32 and rounds once (`fpsim.emulate.compute`),
  its matrix products on a tensor-core model when `device` names a GPU;
* FP8 recipes run each linear layer's GEMMs on FP8 inputs scaled by fpsim.recipes' rules
  (`fpsim.emulate.fp8`);
* a fixed loss scale multiplies the gradient each backward pass starts from and divides
  every parameter's gradient as it arrives (in FP32, before accumulation): each parameter of
  the model gets one hook, at entry or before the first backward pass it can take part in
  (a layer unfrozen in the loop, a lazy module's parameters materialised by its first forward);
* modules and ops to keep run in FP32, autocast off, their inputs cast to FP32, as one
  writes it by hand; with `layers`, only those modules are emulated and their outputs
  return to FP32.

Each autocast context a hook opens lasts while the call it was opened for (an optimizer
step, a kept module's forward) runs: a call that raises past its closing hook has its
context closed by the next torch function, or by the block's end. Leaving the block removes
every hook, mode and kernel it installed: the run goes on as if no emulation had happened
(tests/emulate/test_session.py checks it).
"""

from __future__ import annotations

import contextlib
import copy
import math
import numbers
import sys
import warnings

import torch
from torch.nn.parameter import is_lazy
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ..trace import OUTSIDE, ModuleHook, Tracer, run_eagerly
from . import recipes
from .autocast import PolicyKernels
from .compute import FP32Compute
from .fp8 import FP8Layer, FP8Linear, TensorCoreFP8Gemm, fp32_gemm
from .gemm import TensorCoreGemm
from .policy import POLICIES
from .selection import Names, Selection, read_report

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def emulate(model, recipe, *, device: str | None = None, policy: str = "cuda", keep=(), layers=None,
            from_report=None, loss_scale=None, master_weights: bool = True) -> "Emulation":
    """A context manager under which `model`'s unchanged training loop runs in `recipe`'s numerics.

    recipe: "fp32" or a name in fpsim.emulate.recipes.NAMED ("fp16", "bf16", "fp8", "fp8-e4m3",
        "fp8-current", "mxfp8", "fp8-block"), or an AutocastRecipe / FP8Recipe.
    device: None (GEMMs accumulate in FP32) or a GPU for fpsim.TensorCore ("h100", "a100",
        ...): every matrix product runs through its tensor-core model (slow; see docs).
    policy: the device type whose torch.autocast op lists apply: "cuda" (the GPUs recipes
        are made for) or "cpu" (to compare with real CPU autocast).
    keep: modules (names or types) and ops (``Module:op``) to keep in FP32.
    layers: modules (names or types) to emulate; the rest runs in FP32 (default: all).
    from_report: a saved fpsim report (report.json or its folder): keep in FP32 what it
        judges ``fp32`` for the recipe's formats, and use its recommended loss scale.
    loss_scale: a fixed loss scale (a positive number); None for none (a GradScaler in the
        loop works as it does on a GPU). Given explicitly, it overrides the report's.
    master_weights: False stores the weights in the low format too (rounded after every
        optimizer step), as training without FP32 master weights does; the weights of modules
        that run in FP32 (kept, or outside `layers`) stay FP32.
    """
    return Emulation(model, recipe, device=device, policy=policy, keep=keep, layers=layers,
                     from_report=from_report, loss_scale=loss_scale, master_weights=master_weights)


class Emulation:
    """The running emulation (what ``with fpsim.emulate(...) as em`` gives).

    losses: the value of each backward pass's root (the loss; with a GradScaler, scaled);
    steps: optimizer steps taken; notes: what was not emulated, in words; fp8_layers:
    {module name: FP8Layer} (scales and amax histories); selection: what was kept.
    """

    def __init__(self, model, recipe, *, device, policy, keep, layers, from_report, loss_scale, master_weights):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.recipe = recipes.resolve(recipe)
        self.name = "fp32" if self.recipe is None else self.recipe.name
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if not isinstance(master_weights, bool):
            raise TypeError(f"master_weights must be True or False, got {master_weights!r}")
        self.policy, self.master_weights = policy, master_weights
        self.device_type = _device_type(model)
        low = None if self.recipe is None else self.recipe.low
        self.low = _DTYPES.get(low)
        self._names = Names(model)
        self.selection = Selection()
        self._names.select(keep, "keep", self.selection, "kept_modules")
        if layers is not None:
            self.selection.layers = set()
            self._names.select(layers, "layers", self.selection, "layers")
        report_scale = self._apply_report(from_report) if from_report is not None else None
        self.loss_scale = _check_loss_scale(loss_scale if loss_scale is not None else report_scale)
        self.device = device
        self._gemm = TensorCoreGemm(device) if device is not None else None
        self._fp8_gemm = fp32_gemm
        self._check_device()
        self.losses: list = []
        self.steps = 0
        self.notes: list = []
        self.fp8_layers: dict = {}
        self._scaling = False
        self._autocast_stack: list = []     # (autocast context, frame of the call it lasts for, a step?)
        self._fp8_stack: list = []
        self._fp8_of: dict = {}              # FP8 nn.Linear module -> its FP8Layer
        self._fp8_ran: set = set()           # the FP8Layers that ran a product
        self._unscaling: dict = {}           # id(parameter) -> (parameter, its unscaling hook's handle)
        self._compute = None
        self._exit = None

    # ------------------------------------------------------------------ setup
    def _apply_report(self, path):
        """Keep what the report judges fp32 for this recipe's formats; its loss scale (or None)."""
        if self.recipe is None:
            raise ValueError("from_report needs a recipe other than fp32")
        base = self.recipe.low
        scale = None
        if base is not None:
            advice = read_report(path, base)
            self._names.select(advice.fp32, "from_report", self.selection, "kept_modules")
            scale = advice.loss_scale
        if isinstance(self.recipe, recipes.FP8Recipe):
            for fmt in dict.fromkeys(self.recipe.element_formats):
                for name in read_report(path, fmt).fp32:     # a layer, or an op of a linear layer: not in FP8
                    module, _, op = name.rpartition(":") if not self._names.is_module(name) else (name, "", "")
                    if module == OUTSIDE:
                        continue
                    module = self._names.module(module, "from_report")
                    if not op or isinstance(self._names.modules[module], torch.nn.Linear):
                        self.selection.not_fp8.add(module)
        return scale

    def _check_device(self):
        """Fail now, not mid-run, when the tensor-core model lacks the recipe's formats."""
        if self._gemm is None:
            return
        if self.recipe is None:
            raise ValueError(f"device={self.device!r} models the matrix products of a low-precision recipe; "
                             f"recipe fp32 has none")
        if self.low is not None:
            self._gemm.core(self.recipe.low)
        if isinstance(self.recipe, recipes.FP8Recipe):
            if not self.recipe.per_tensor:
                raise ValueError(f"device={self.device!r} models GEMMs of FP8 elements with per-tensor scales; the "
                                 f"{self.recipe.scaling.name} scaling of recipe {self.recipe.name} runs with FP32 "
                                 f"accumulation only (device=None)")
            forward, backward = self.recipe.element_formats
            self._gemm.core(forward, forward, None)
            self._gemm.core(backward, forward, self.recipe.promote_every)
            self._fp8_gemm = TensorCoreFP8Gemm(self._gemm, self.recipe.fast_accumulation, self.recipe.promote_every)

    # -------------------------------------------------------------- life cycle
    def __enter__(self) -> "Emulation":
        if any(isinstance(mode, _Functions) for mode in torch.overrides._get_current_function_mode_stack()):
            raise RuntimeError("fpsim.emulate is already running: emulations do not nest")
        stack = contextlib.ExitStack()
        try:
            self._enter(stack)
        except BaseException:
            stack.close()
            raise
        self._exit = stack
        return self

    def __exit__(self, *exc):
        stack, self._exit = self._exit, None
        if stack is not None:
            stack.close()
        compute = self._compute
        if compute is not None and compute.unemulated:
            self.notes.append("ran by torch in the low format (no meta kernel to type their outputs): "
                              + ", ".join(sorted(compute.unemulated)))
        if compute is not None and compute.unmodelled:
            self.notes.append(f"accumulated in FP32, not on the {self.device} tensor-core model (only matrix "
                              f"products are modelled): " + ", ".join(sorted(compute.unmodelled)))
        idle = [name for name, layer in self.fp8_layers.items() if layer not in self._fp8_ran]
        if idle and (self._fp8_ran or self.losses):
            self.notes.append(f"FP8 layers that ran no FP8 product in the block (their forward was not called; a "
                              f"product with their weight outside it runs in {self.recipe.base}): " + ", ".join(idle))
        return False

    def summary(self) -> dict:
        """What ran how: recipe, options, steps, losses, notes, and each FP8 layer's last scales (JSON-ready)."""
        fp8 = {name: {role: {"format": state.format.name, "scale": None if state.used is None else state.used.item(),
                             "amax": None if not state.history else state.history[-1]}
                      for role, state in (("input", layer.input), ("weight", layer.weight),
                                          ("grad_output", layer.grad_output))}
               for name, layer in self.fp8_layers.items()}
        selection = self.selection
        return {"recipe": self.name, "device": self.device, "policy": self.policy, "loss_scale": self.loss_scale,
                "master_weights": self.master_weights, "kept_modules": sorted(selection.kept_modules),
                "kept_ops": {op: sorted(modules) for op, modules in sorted(selection.kept_ops.items())},
                "layers": None if selection.layers is None else sorted(selection.layers),
                "steps": self.steps, "losses": list(self.losses), "notes": list(self.notes), "fp8_layers": fp8}

    def _enter(self, stack):
        model, selection = self.model, self.selection
        stack.enter_context(run_eagerly())      # compiled code runs eagerly, under the emulation's own modes
        if not self.master_weights and self.low is not None:
            self._round_weights()
        wide = sorted({name.rpartition(".")[0] or name for name, p in model.named_parameters()
                       if p.dtype == torch.float64})
        if wide and self.low is not None:    # autocast casts float32 only: these layers would run as they are
            note = (f"{', '.join(wide[:5])}{' and others' if len(wide) > 5 else ''} hold float64 parameters, which "
                    f"torch.autocast (and this emulation of it) leaves in float64: convert the model to float32 "
                    f"(model.float()) to see {self.name} there")
            self.notes.append(note)
            warnings.warn(f"fpsim.emulate: {note}", RuntimeWarning, stacklevel=3)
        if self.low is not None:
            tracer = None
            if selection.kept_ops:
                tracer = Tracer(_Quiet())
                tracer.names.add_root(model, self._names.label, prefix_label=False)
                tracer.attach()
                stack.callback(tracer.close)
            stack.enter_context(PolicyKernels(self.policy, self.device_type, self.low, selection.kept_ops,
                                              tracer.current_module if tracer else None))
            stack.enter_context(self._block_autocast())
        stack.callback(self._drain)          # before the block's own autocast exits
        if self.low is not None or self._gemm is not None:
            self._compute = FP32Compute(self._gemm)
            stack.enter_context(self._compute)
        stack.enter_context(_Functions(self))
        fp8 = isinstance(self.recipe, recipes.FP8Recipe)
        outside = _multiplied_outside(model) if fp8 else set()
        not_fp8 = []
        for name, module in model.named_modules():
            if name in selection.kept_modules:
                self._hook(stack, module, self._enter_fp32, self._leave)
            elif selection.layers is not None and name in selection.layers and self.low is not None:
                self._hook(stack, module, self._enter_layer, self._leave_layer)
            if fp8 and _fp8_module(module) and selection.runs_fp8(name):
                if module in outside:
                    not_fp8.append(name)
                    continue
                self.fp8_layers[name] = self._fp8_of[module] = FP8Layer(self.recipe, self._fp8_gemm)
                self._hook(stack, module, self._enter_fp8, self._leave_fp8)
        if not_fp8:
            self.notes.append(f"not FP8 layers, run in {self.recipe.base}: {', '.join(not_fp8)} (nn.MultiheadAttention "
                              f"multiplies by its out_proj's weight itself, in F.multi_head_attention_forward, never "
                              f"calling the layer, so TransformerEngine's te.Linear in its place would not run it in "
                              f"FP8 either; te.MultiheadAttention has FP8 projections of its own)")
        if self.loss_scale is not None:
            stack.callback(self._remove_unscaling)
            self._hook_unscaling()
        stack.callback(register_optimizer_step_pre_hook(self._before_step).remove)
        stack.callback(register_optimizer_step_post_hook(self._after_step).remove)

    @staticmethod
    def _hook(stack, module, before, after):
        stack.callback(module.register_forward_pre_hook(ModuleHook(before), with_kwargs=True).remove)
        stack.callback(module.register_forward_hook(ModuleHook(after), always_call=True).remove)

    # ------------------------------------------------------------------ hooks
    def _push_autocast(self, enabled: bool, call, step: bool = False):
        """Enter an autocast context that lasts while `call` (the frame of a module's forward or an
        optimizer step, whose hook asks) runs: its closing hook, or `_settle` if that never runs."""
        self._settle()
        context = torch.autocast(self.device_type, dtype=self.low, enabled=enabled, cache_enabled=False) \
            if self.low is not None else torch.autocast(self.device_type, enabled=False)
        context.__enter__()
        self._autocast_stack.append((context, call, step))

    def _pop_autocast(self, call):
        """Exit the context `call` opened, and any left open above it by calls inside it."""
        stack = self._autocast_stack
        if any(frame is call for _, frame, _ in stack):
            while True:
                context, frame, _ = stack.pop()
                context.__exit__(None, None, None)
                if frame is call:
                    break

    def _settle(self):
        """Exit the contexts whose calls ended without their closing hook (a step or forward that
        raised): autocast is then what it is outside them. Contexts nest as their calls do, so
        once the innermost one's call runs, all do."""
        stack = self._autocast_stack
        while stack and not _running(stack[-1][1]):
            stack.pop()[0].__exit__(None, None, None)

    def _drain(self):
        """Exit every context still open, innermost first (the block ends)."""
        while self._autocast_stack:
            self._autocast_stack.pop()[0].__exit__(None, None, None)

    def _enter_fp32(self, module, args, kwargs):
        self._push_autocast(False, sys._getframe(1))
        return _to_fp32(args), _to_fp32(kwargs)

    def _leave(self, module, args, output):
        self._pop_autocast(sys._getframe(1))

    def _enter_layer(self, module, args, kwargs):
        self._push_autocast(True, sys._getframe(1))

    def _leave_layer(self, module, args, output):
        self._pop_autocast(sys._getframe(1))
        return _to_fp32(output)

    def _enter_fp8(self, module, args, kwargs):
        mode = None
        if _recomputing():
            # a forward that activation checkpointing recomputes in backward, where the block's function mode is
            # off (each dispatch of the backward call stepped it aside): the layer's own, while it runs
            mode = _Functions(self)
            mode.__enter__()
        self._fp8_stack.append((module, mode))

    def _leave_fp8(self, module, args, output):
        if self._fp8_stack:
            _, mode = self._fp8_stack.pop()
            if mode is not None:
                mode.__exit__(None, None, None)

    def _hook_unscaling(self):
        """Put the unscaling hook on each parameter of the model that can take a gradient now and has none yet:
        at entry, and before each backward pass, so that a layer unfrozen in the loop or a lazy module's
        parameters (materialised by its first forward) are unscaled too, each exactly once."""
        for param in self.model.parameters():
            if param.requires_grad and id(param) not in self._unscaling and not is_lazy(param):
                self._unscaling[id(param)] = (param, param.register_hook(self._unscale))

    def _remove_unscaling(self):
        while self._unscaling:
            _, handle = self._unscaling.popitem()[1]
            handle.remove()

    def _unscale(self, grad):
        return grad * (1.0 / self.loss_scale) if self._scaling else None

    def _before_step(self, optimizer, args, kwargs):
        self._push_autocast(False, sys._getframe(1), step=True)
        # the loop's forward and backward run inside step(closure) (LBFGS, Lightning's automatic optimisation):
        # the closure runs as the loop outside a step would, the optimizer's own arithmetic as before
        if callable(kwargs.get("closure")):
            return args, {**kwargs, "closure": self._as_outside_step(kwargs["closure"])}
        at = 1 if args and args[0] is optimizer else 0      # (torch hands the hook step's own args, self first)
        if len(args) > at and callable(args[at]):
            return (*args[:at], self._as_outside_step(args[at]), *args[at + 1:]), kwargs
        return None

    def _as_outside_step(self, closure):
        """`closure` under the block's own autocast (off inside an optimizer step)."""
        def run():
            with self._block_autocast() if self.low is not None else contextlib.nullcontext():
                return closure()
        return run

    def _block_autocast(self):
        """The autocast the block runs the loop under: the recipe's format, everywhere unless `layers` names
        the modules that run in it."""
        return torch.autocast(self.device_type, dtype=self.low, enabled=self.selection.layers is None,
                              cache_enabled=False)

    def _after_step(self, optimizer, args, kwargs):
        self._pop_autocast(sys._getframe(1))
        if any(step for _, _, step in self._autocast_stack):
            return                   # a step inside another (super().step(), a wrapping optimizer): one step
        self.steps += 1
        if not self.master_weights and self.low is not None:
            self._round_weights()

    def _round_weights(self):
        """Without master weights: store in the low format the weights of every module that runs in
        it; those of modules run in FP32 (kept, or outside `layers`) stay FP32, as their computation."""
        low = {}
        for name, module in self.model.named_modules():
            if self.selection.runs_low(name):
                low.update((id(p), p) for p in module.parameters(recurse=False) if p.is_floating_point())
        with torch.no_grad():
            for param in low.values():
                param.copy_(param.to(self.low))

    # ----------------------------------------------- functions the mode takes over
    def backward(self, func, args, kwargs):
        """Tensor.backward / torch.autograd.backward: autocast off, the loss recorded and scaled."""
        if func is torch.Tensor.backward:
            names = ("gradient", "retain_graph", "create_graph", "inputs")
            root, bound = args[0], dict(zip(names, args[1:]), **kwargs)
            roots, grads = [root], [bound.get("gradient")]
        else:
            names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
            bound = dict(zip(names, args), **kwargs)
            roots = [bound["tensors"]] if isinstance(bound["tensors"], torch.Tensor) else list(bound["tensors"])
            grads = bound.get("grad_tensors")
            grads = [grads] if isinstance(grads, torch.Tensor) or grads is None else list(grads)
            grads = grads + [None] * (len(roots) - len(grads))
        if len(roots) == 1 and roots[0].numel() == 1:
            self.losses.append(float(roots[0].detach()))
        if self.loss_scale is not None:        # (a gradient left implicit for a non-scalar root stays an error)
            grads = [g if g is None and r.numel() != 1 else (torch.ones_like(r) if g is None else g) * self.loss_scale
                     for r, g in zip(roots, grads)]
            if func is torch.Tensor.backward:
                bound["gradient"] = grads[0]
            else:
                bound["grad_tensors"] = grads
        if self.loss_scale is not None:
            self._hook_unscaling()
        with torch.autocast(self.device_type, enabled=False):
            self._scaling = self.loss_scale is not None
            try:
                if func is torch.Tensor.backward:
                    return func(roots[0], **bound)
                return func(**bound)
            finally:
                self._scaling = False

    def linear(self, func, args, kwargs):
        """F.linear: an FP8 layer's GEMMs, when called by an FP8 nn.Linear with its own weight."""
        module = self._fp8_running()
        bound = dict(zip(("input", "weight", "bias"), args), **kwargs)
        if not isinstance(module, torch.nn.Linear) or not _own_weight(module, bound.get("weight")):
            return func(*args, **kwargs)
        return self._fp8_product(module, bound["input"], bound["weight"], bound.get("bias"))

    def addmm(self, func, args, kwargs):
        """torch.addmm: an FP8 layer's GEMMs, when called by an FP8 Conv1D with its own weight and bias (bias +
        x W: x (W^T)^T + bias, a Linear whose weight is W^T)."""
        module = self._fp8_running()
        bound = dict(zip(("input", "mat1", "mat2"), args), **kwargs)
        if module is None or isinstance(module, torch.nn.Linear) or bound.get("mat2") is not module.weight \
                or bound.get("input") is not module.bias or bound.get("beta", 1) != 1 or bound.get("alpha", 1) != 1:
            return func(*args, **kwargs)
        return self._fp8_product(module, bound["mat1"], module.weight.t(), module.bias)

    def _fp8_running(self):
        """The innermost FP8 layer running, or None."""
        return self._fp8_stack[-1][0] if self._fp8_stack else None

    def _fp8_product(self, module, x, weight, bias):
        """x W^T + bias by the module's FP8 layer, in the dtype autocast would give it."""
        layer = self._fp8_of[module]
        self._fp8_ran.add(layer)
        on = torch.is_autocast_enabled(self.device_type)
        out_dtype = torch.get_autocast_dtype(self.device_type) if on else x.dtype
        again = _recomputing()                              # recomputed in backward: the same casts again
        with torch.autocast(self.device_type, enabled=False):
            return FP8Linear.apply(x, weight, bias, layer, out_dtype, again)


def _recomputing() -> bool:
    """Whether a forward runs inside a backward pass: activation checkpointing recomputing it."""
    return torch._C._current_graph_task_id() != -1


def _fp8_module(module) -> bool:
    """A layer the FP8 recipes run in FP8: an nn.Linear, or transformers' Conv1D (GPT-2's projections: a Linear
    whose weight is stored transposed and multiplied by torch.addmm), as TransformerEngine's te.Linear replaces
    either."""
    return isinstance(module, torch.nn.Linear) or (type(module).__name__ == "Conv1D" and hasattr(module, "nf"))


def _multiplied_outside(model) -> set:
    """The linear layers whose weight their owner multiplies itself, never calling them: nn.MultiheadAttention's
    out_proj (F.multi_head_attention_forward takes out_proj.weight and out_proj.bias)."""
    return {module.out_proj for module in model.modules() if isinstance(module, torch.nn.MultiheadAttention)}


def _own_weight(module, weight) -> bool:
    """Whether `weight` is the Linear's own: the parameter itself, or, where a parametrization computes it
    (weight_norm, spectral_norm: a new tensor at each access), a weight of its shape."""
    if torch.nn.utils.parametrize.is_parametrized(module, "weight"):
        return isinstance(weight, torch.Tensor) and weight.shape == (module.out_features, module.in_features)
    return weight is module.weight


class _Functions(TorchFunctionMode):
    """Hands backward calls, F.linear and torch.addmm to the emulation; everything else runs as it is."""

    def __init__(self, emulation: Emulation):
        super().__init__()
        self.handlers = {torch.Tensor.backward: emulation.backward, torch.autograd.backward: emulation.backward,
                         torch.autograd.grad: self._grad}
        if isinstance(emulation.recipe, recipes.FP8Recipe):
            self.handlers[torch.nn.functional.linear] = emulation.linear
            self.handlers[torch.addmm] = emulation.addmm
        self.device_type = emulation.device_type
        self.emulation = emulation

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.emulation._autocast_stack:
            self.emulation._settle()
        handler = self.handlers.get(func)
        if handler is None:
            return func(*args, **(kwargs or {}))
        return handler(func, args, kwargs or {})

    def _grad(self, func, args, kwargs):
        with torch.autocast(self.device_type, enabled=False):
            return func(*args, **kwargs)


class _Quiet:
    """A Tracer client that only wants the module stack."""

    def module_output(self, name, module, output):
        return None


def _running(frame) -> bool:
    """Whether `frame` is on the current thread's call stack (its call has not returned or raised)."""
    current = sys._getframe(1)
    while current is not None:
        if current is frame:
            return True
        current = current.f_back
    return False


def _to_fp32(x):
    """x with every fp16/bf16 tensor cast to float32, at any depth of the containers torch's pytree knows
    (tuples, lists, dicts, namedtuples such as PackedSequence, transformers' ModelOutput) and of other dict and
    list subclasses. Every container keeps its type, every other leaf (an integer tensor: PackedSequence's
    batch sizes and indices) is left as it is; x itself when nothing is cast."""
    leaves, spec = pytree.tree_flatten(x)
    cast = [_leaf_to_fp32(leaf) for leaf in leaves]
    if all(new is old for new, old in zip(cast, leaves)):
        return x
    return pytree.tree_unflatten(cast, spec)


def _leaf_to_fp32(x):
    """_to_fp32 of a leaf of torch's pytree: a tensor, or a dict or list subclass pytree does not know (a copy
    of it with its items replaced)."""
    if isinstance(x, torch.Tensor):
        return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if isinstance(x, (dict, list)):
        items = list(x.items() if isinstance(x, dict) else enumerate(x))
        cast = [(key, _to_fp32(value)) for key, value in items]
        if all(new is old for (_, new), (_, old) in zip(cast, items)):
            return x
        x = copy.copy(x)
        for key, value in cast:
            x[key] = value
    return x


def _device_type(model) -> str:
    for tensor in list(model.parameters()) + list(model.buffers()):
        device_type = tensor.device.type
        break
    else:
        device_type = "cpu"
    if not torch.amp.is_autocast_available(device_type):
        raise ValueError(f"the model lies on {device_type}, where torch.autocast is not available")
    return device_type


def _check_loss_scale(scale):
    """The loss scale as a float: any real number (numpy's included, bools not) that is positive and finite."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"loss_scale must be a positive finite number or None, got {scale!r}")
    return float(scale)
