"""Which module and op made a tensor: op-level interception, used by analyze to observe and by emulate to round.

A `Tracer` is a TorchDispatchMode plus two global module hooks. Every aten op
the run computes passes through it, forward and backward, with its `Site`:
the innermost module running it (by qualified name) and the op. It hands the
op's floating-point outputs (complex ones too: their parts are floats) to a
client, which may observe them or return replacements (emulation rounds them):

    client.forward_op(site, outputs)    -> None, or a list of replacement tensors
    client.backward_op(site, outputs)   -> None, or a list of replacement tensors (optional)
    client.output_grad(site, grads)     (the gradients of a forward op's outputs; optional)
    client.tagged_grad(tag, grad)       (the gradient of an output tagged with `hook_output`)
    client.module_output(name, module, output)
    client.backward_done()              (a backward pass of the run ended, before any update; optional)

The client's own tensor operations must run inside `tracer.busy()`.

A client without `backward_op` gets no backward ops: the mode steps aside
while autograd's engine runs (torch.autograd's `_engine_run_backward` is
wrapped while such a tracer is attached), so that a backward pass costs what
it costs unobserved; gradient pre-hooks and parameter hooks still run, and
the client hears when each backward pass ends (`backward_done`).

How the pieces are found:
- the innermost module: a stack kept by global forward pre/post hooks (the
  post hook always runs, also when forward raises); a module outside the
  named roots is itself a new root, or, where the client names its roots
  alone (`ModuleNames(new_roots=False)`: a watched model), no module at all:
  its ops are the loop's (OUTSIDE) and the client hears nothing of it;
- the site of a backward op: the forward op that created the autograd node now
  running (torch._C._current_autograd_node), remembered by the node's sequence
  number when the forward op ran (a bounded table, cleared by `forget_graph`);
- the gradient of a forward op's outputs: a pre-hook on its autograd node,
  registered when a later op consumes the output (so never on a leaf; it dies
  with the graph);
- the dtype an op ran in: its outputs' dtype, after autocast cast its inputs
  (the mode sits below autocast in the dispatcher, so it sees the casts too);
- a forward that activation checkpointing recomputes in backward: a module
  starting with grad on while a backward pass runs. A non-reentrant
  checkpoint's forward ran with grad and was heard of: its recomputation is not
  (module outputs are skipped; the mode, stepped aside, sees no op). A reentrant
  one (an autograd Function's) ran its forward without grad: its recomputation,
  from the Function's backward until the Function's own backward call, is the
  forward the client hears of, under the modules that ran the Function (found by
  the autograd node the Function made while grad was off), and the nodes it
  makes get their gradient pre-hooks (`_replay_function`). `module_grad()` says
  whether the innermost module started with grad: under no_grad autocast casts
  weights with grad on.

Several tracers may intercept at once (two watches, two framework callbacks),
and close in any order: torch pops whatever mode is on top, so a tracer pops its
mode only when it is on top; under another mode its mode pauses (inert, passing
every op on) and comes back to life where it is, and an inert mode leaves the
stack as soon as it is on top (when any tracer pushes or pops, or a backward
pass starts). Once every tracer closed, none of their modes is left, unless a
mode of the run's own sits above one (it goes at the next tracer's start).

What it cannot see, and says (`notes`): code compiled by torch.compile runs
fused kernels; the mode steps aside while Dynamo compiles (it declares
ignore_compile_internals) so that compiled code stays exactly as it would be
unobserved, and only the library kernels compiled code calls (matmuls) pass
through it, attributed to the compiled module. TorchScript modules run their
inside as one call: their ops are attributed to the scripted module itself.
View ops and copies (no new values: clone, _unsafe_view, copy_),
uninitialised allocations (empty) and constants (zeros, ones, full, *_like)
are skipped, though a skipped view or copy that consumes an observed op's
output gets that output its gradient hook (a Linear on 3-D input: addmm, then
a view); a skipped op that only reads its input's shape or value (ones_like:
the seed of loss.backward(); detach; item()) does not: its output carries no
gradient back, and a loss nothing else consumes keeps no gradient. A
change of dtype (_to_copy, autocast's casts) is an op. Of an op with several
floating outputs, those its meta kernel keeps in float32 for float16 inputs
(a fused kernel's statistics) are not handed on: no FP16 run stores them in FP16.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref

OUTSIDE = "loop"
"""Module name of ops that run outside every module (a loss computed in the training loop, say)."""
MAX_NODES = 1 << 20
"""At most this many autograd nodes are remembered between two `forget_graph` calls."""
_WRAPPERS = ("DistributedDataParallel", "DataParallel", "OptimizedModule", "FullyShardedDataParallel")
_WRAPPED_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a tensor was made: the innermost module (qualified name) and the aten op (no overload)."""

    module: str
    op: str
    name: str = dataclasses.field(init=False, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "name", f"{self.module}:{self.op}")


def unwrap(module):
    """The module inside DistributedDataParallel, DataParallel, FSDP and torch.compile wrappers."""
    seen = 0
    while type(module).__name__ in _WRAPPERS and seen < 8:
        inner = getattr(module, "_orig_mod", None) or getattr(module, "module", None)
        if inner is None:
            break
        module, seen = inner, seen + 1
    return module


class IdentityMap:
    """A mapping keyed by object identity that holds its keys weakly: an entry goes when its object dies.

    For modules and tensors on hot paths: a WeakKeyDictionary makes a weak
    reference at every lookup, this makes one per entry.
    """

    def __init__(self):
        self._entries: dict = {}            # id(obj) -> (weak reference, value)

    def get(self, obj, default=None):
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else default

    def __contains__(self, obj) -> bool:
        entry = self._entries.get(id(obj))
        return entry is not None and entry[0]() is obj

    def __setitem__(self, obj, value) -> None:
        key, entries = id(obj), self._entries

        def gone(ref):
            if entries.get(key, (None,))[0] is ref:
                del entries[key]
        entries[key] = (weakref.ref(obj, gone), value)

    def __len__(self) -> int:
        return len(self._entries)


class ModuleHook(functools.partial):
    """A hook fpsim puts on the user's module: ModuleHook(fn) calls fn, with no frame of its own between
    (a partial: the emulation's hooks find the module's call as their caller's frame). A copy of the module
    (copy.deepcopy: an EMA model, the best model so far) or a pickle of it (torch.save(model)) gets an
    InertHook in its place: the copy is not the module observed or emulated, and fpsim's state
    (thread-local flags, dispatch modes, which cannot be copied) does not travel with it."""

    __slots__ = ()

    def __reduce__(self):
        return InertHook, ()


class InertHook:
    """What a copy of a module holds in place of fpsim's hook: a hook that does nothing."""

    def __call__(self, *args):
        return None


def _strip(name: str) -> str:
    for prefix in _WRAPPED_PREFIXES:
        name = name.replace(prefix, "")
        if name == prefix[:-1]:
            return ""
    return name


class ModuleNames:
    """Qualified names of modules, held weakly: a module that dies is forgotten, its root label reused.

    add_root(model, label): name `model`'s modules as in model.named_modules()
    (the root itself by `label`), wrappers (DDP, torch.compile) included. A
    module called for the first time outside every named root is a new root,
    labelled by its class; a second live root of the same class is `Class#2`.
    A root created every step (a loss module made inside the loop) takes back
    the label of the dead one, so names and records do not grow. With
    new_roots=False (a watched model: its modules alone are named), such a
    module gets no name: `adopt` gives OUTSIDE, and `is_outside` tells it.
    """

    def __init__(self, new_roots: bool = True):
        self.new_roots = new_roots
        self._names = IdentityMap()                 # module -> qualified name
        self._roots: dict = {}                      # label -> weakref to the root
        self._prefixed: dict = {}                   # label -> whether its modules' names start with it
        self._outside = IdentityMap()               # modules found outside every root (new_roots=False)
        self.scripted: list = []                    # names of TorchScript modules seen
        self.compiled: list = []                    # names of torch.compile'd modules seen
        self.new_names: list = []                   # (module, name) named since the client last looked

    def get(self, module):
        return self._names.get(module)

    def is_root(self, name: str) -> bool:
        return name in self._roots

    def add_root(self, model, label: str, prefix_label: bool = True) -> None:
        import torch

        core = unwrap(model)
        self._roots[label] = weakref.ref(core)
        self._prefixed[label] = prefix_label
        self._name_chain(model, core, label)
        self._name_descendants(core, label)
        if isinstance(core, torch.jit.ScriptModule):
            self.scripted.append(label)

    def _name_descendants(self, core, label: str) -> None:
        """Name the modules of the root `core` (labelled `label`) that have no name yet."""
        import torch

        for name, mod in core.named_modules():
            if not name or mod in self._names:
                continue
            name = _strip(name)
            qual = f"{label}.{name}" if self._prefixed[label] else name
            self._set(mod, qual)
            if isinstance(mod, torch.jit.ScriptModule) and not _inside_script(name, core):
                self.scripted.append(qual)

    def _name_chain(self, model, core, name: str) -> None:
        """Give `model`, the wrappers inside it and their `core` the name `name`; note a torch.compile wrapper."""
        chain, m = [model], model
        while m is not core:
            m = getattr(m, "_orig_mod", None) or getattr(m, "module")
            chain.append(m)
        for wrapper in chain:
            if type(wrapper).__name__ == "OptimizedModule":
                self.compiled.append(name)
            self._set(wrapper, name)

    def _set(self, module, name: str) -> None:
        self._names[module] = name
        self.new_names.append((module, name))

    def is_outside(self, module) -> bool:
        """Whether `module` was found outside every root (new_roots=False)."""
        return module in self._outside

    def adopt(self, module) -> str:
        """Name a module seen for the first time outside every known root; its name. A wrapper made around a
        module already named (torch.compile(model) after watch(model)) takes that module's name, and a module
        added to a root after the root was named its qualified name. Any other module is a new root, or, with
        new_roots=False, outside: OUTSIDE (remembered, `is_outside`)."""
        core = unwrap(module)
        known = self._names.get(core)
        if known is not None:
            self._name_chain(module, core, known)
            return known
        if not self.new_roots:
            if module in self._outside:
                return OUTSIDE
            for label, ref in list(self._roots.items()):
                root = ref()
                if root is not None and any(m is core for m in root.modules()):
                    self._name_descendants(root, label)
                    known = self._names.get(core)
                    if module is not core:            # a wrapper made around it
                        self._name_chain(module, core, known)
                    return known
            self._outside[module] = True
            return OUTSIDE
        base = type(core).__name__
        label, n = base, 2
        while label in self._roots and self._roots[label]() is not None:
            label, n = f"{base}#{n}", n + 1
        self.add_root(module, label)
        return label


def _inside_script(name: str, core) -> bool:
    """Whether a submodule lies inside a TorchScript module (only the outermost one is named in notes)."""
    import torch

    parts = name.split(".")
    m = core
    for part in parts[:-1]:
        m = getattr(m, part, None)
        if isinstance(m, torch.jit.ScriptModule):
            return True
    return False


def _op_name(func):
    """The op's short name ('mul'), or for ops whose outputs are skipped None or "": views make no new values,
    copies repeat what is known (None: their output carries the gradient of their inputs back, so a later op
    that consumes it consumes them); empty allocations hold garbage, constants repeat what is known, detach and
    item() read a value ("": no gradient flows back through them; ones_like is the seed of loss.backward())."""
    name = func._schema.name
    if name in ("aten::detach", "aten::lift_fresh", "aten::_local_scalar_dense") or name.startswith(
            ("aten::empty", "aten::new_empty")) or name.endswith("_like") or name in (
            "aten::zeros", "aten::ones", "aten::full", "aten::scalar_tensor", "aten::arange", "aten::new_zeros",
            "aten::new_ones", "aten::new_full"):
        return ""
    if func.is_view or name in ("aten::alias", "aten::clone", "aten::_unsafe_view", "aten::copy_", "aten::view_copy"):
        return None
    return name.split("::")[-1]


_OP_NAMES: dict = {}
"""OpOverload -> its short name, or None / "" when its outputs are skipped (`_op_name`; filled as ops are first
seen)."""


def _float_outputs(out, tensor_type) -> list:
    """The floating-point tensors of an op's output, complex ones included (their parts are floats)."""
    if isinstance(out, tensor_type):
        return [out] if out.is_floating_point() or out.is_complex() else []
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, tensor_type) and (t.is_floating_point() or t.is_complex())]
    return []



_WIDE_OUTPUTS: dict = {}
"""Ops of several floating outputs -> which of them stay float32 when the inputs are float16 (None: unknown)."""


def _low_precision_outputs(func, args, kwargs, outputs: list) -> list:
    """The outputs of a forward op that a low-precision run holds in low precision: those its meta kernel
    gives in float16 for float16 inputs. A fused kernel's statistics stay float32 whatever its inputs
    (CPU flash attention's log-sum-exp, a norm's mean and inverse deviation): a run in FP16 never stores
    them in FP16, so they are not judged as its activations. Asked once per op; without a meta kernel,
    all."""
    wide = _WIDE_OUTPUTS.get(func, False)
    if wide is False:
        wide = _WIDE_OUTPUTS[func] = _wide_outputs(func, args, kwargs or {})
    if wide is None or len(wide) != len(outputs):
        return outputs
    return [t for t, stays_wide in zip(outputs, wide) if not stays_wide]


def run_eagerly():
    """A context in which torch.compile'd code runs eagerly, where torch has compiler stances (2.6 on): the
    shadow steps' replays and an emulation run the model's own ops under their own modes, which Dynamo would
    trace (or, compiled with fullgraph=True, refuse: "found no compiled frames")."""
    import contextlib

    import torch

    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def to_meta(x, floating=None):
    """x (tensors in lists, tuples and dicts) as meta tensors of the same shapes and strides, for asking an
    op's meta kernel about its outputs; floating: the dtype given to floating tensors (None: theirs)."""
    import torch

    if isinstance(x, torch.Tensor):
        dtype = floating if floating is not None and x.is_floating_point() else x.dtype
        return torch.empty_strided(x.shape, x.stride(), dtype=dtype, device="meta")
    if isinstance(x, (list, tuple)):
        return type(x)(to_meta(v, floating) for v in x)
    if isinstance(x, dict):
        return {k: to_meta(v, floating) for k, v in x.items()}
    return x


def _wide_outputs(func, args, kwargs) -> tuple | None:
    import torch

    try:
        out = func(*to_meta(args, torch.float16), **to_meta(kwargs, torch.float16))
    except Exception:   # no meta kernel, or one that needs data
        return None
    return tuple(t.dtype == torch.float32 for t in _float_outputs(out, torch.Tensor))


def _replace(out, old: list, new: list):
    """`out` with the tensors of `old` swapped for `new` (same order)."""
    if not isinstance(out, (tuple, list)):
        return new[0]
    swap = {id(o): n for o, n in zip(old, new)}
    return type(out)(swap.get(id(t), t) for t in out)


def _make_mode_class():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Mode(TorchDispatchMode):
        """Hands each op to its tracer; steps aside while torch.compile compiles (compiled code stays as is)."""

        def __init__(self, tracer):
            super().__init__()
            self.tracer = tracer        # who hears of its ops: the owner, or _PASS_THROUGH while inert
            self.owner = tracer         # the tracer whose mode it is (None once that tracer closed)

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            return True

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False   # the handler never compiles: spare each op torch._dynamo.disable's wrapper

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func._op(*args, **kwargs) if kwargs else func._op(*args)   # what func(...) calls
            return self.tracer._on_op(func, out, args, kwargs)

    return _Mode


_MODE_CLASS = None


class Tracer:
    """Op-level interception for one client: `attach()` (or a with block) starts it, `close()` ends it.

    names: a ModuleNames (the client names its model there first). The client
    switches op interception on and off with `intercept(bool)`, and the module
    hooks with `modules(bool)` (between steps: the module stack starts empty).
    """

    def __init__(self, client, names: ModuleNames | None = None):
        self.client = client
        self.names = names if names is not None else ModuleNames()
        self._stack: list = []                  # names of the modules running, innermost last
        self._grads: list = []                  # whether grad was on when each of them started
        self._nodes: dict = {}                  # autograd sequence number -> Site of the forward op
        self._hooked: dict = {}                 # sequence number of a node given a gradient pre-hook -> its tags
        self._last_sequence = -1
        self._busy = threading.local()           # the client's own tensor work passes through untouched
        self._mode = None
        self._aside = False                      # the mode is popped while autograd's engine runs
        self._functions: dict = {}              # sequence number of an autograd Function's node whose forward ran
                                                #   without grad -> (module stack, grads) when it ran
        self._hooked_functions: set = set()      # sequence numbers of those given their hooks (`_hook_function`)
        self._recompute = None                   # depth of a forward recomputed in backward that was counted (skipped)
        self._replay = None                      # (module stack, grads, mode pushed) of the forward a reentrant
        self._replaying = False                  #   checkpoint recomputes (heard of as the forward), while it runs
        self._handles: list = []
        self._sites: dict = {}                   # (module name, op) -> Site
        self._prehook = self._on_node_grads      # one bound method for every node hooked
        import torch                             # what the per-op and per-module paths call, at hand

        self._tensor = torch.Tensor
        self._is_compiling = torch.compiler.is_compiling
        self._current_node = torch._C._current_autograd_node
        self._next_sequence = torch._C._autograd._get_sequence_nr
        self._graph_task = torch._C._current_graph_task_id
        self._function_node = torch.autograd.function.BackwardCFunction
        self._grad_enabled = torch.is_grad_enabled
        self.error = None
        self._grad_wanted = hasattr(client, "output_grad")
        self._backward_wanted = hasattr(client, "backward_op")

    # ------------------------------------------------------------ life cycle
    def attach(self) -> "Tracer":
        """Start following modules (the global module hooks); `intercept(True)` starts the op interception."""
        self.modules(True)
        if not self._backward_wanted:
            _steps_aside_in_backward(self, True)
        return self

    def modules(self, on: bool) -> None:
        """Add or remove the global module hooks (steps nobody observes need not pay for them)."""
        from torch.nn.modules import module as nn_module

        if on and not self._handles:
            self._end_replay()
            self._stack.clear()
            self._grads.clear()
            self._recompute = None
            self._handles = [nn_module.register_module_forward_pre_hook(self._on_pre),
                             nn_module.register_module_forward_hook(self._on_post, always_call=True)]
        elif not on:
            for handle in self._handles:
                handle.remove()
            self._handles = []

    def intercept(self, on: bool) -> None:
        """Push or pop the dispatch mode (ops cost nothing extra while it is off).

        Only a mode on top of torch's stack can be popped (torch pops whatever is on top: modes leave in the
        order they came). One under another mode (a second watch's, the run's own) is paused instead: inert, it
        passes every op on, and comes back to life where it is when interception resumes. Every inert mode
        leaves the stack as soon as it is on top: whenever a tracer pushes or pops its mode, or autograd's engine
        starts (`_drop_inert_modes`); a closed tracer's mode stays inert.
        """
        global _MODE_CLASS

        mode = self._mode
        if on:
            if mode is not None:                      # on the stack (paused, or popped for a backward pass)
                mode.tracer = self
                return
            if _MODE_CLASS is None:
                _MODE_CLASS = _make_mode_class()
            _drop_inert_modes()
            self._mode = _MODE_CLASS(self)
            self._mode.__enter__()
        elif mode is not None:
            if self._aside:                           # popped for a backward pass: it stays out
                self._mode = None
            elif _top_mode() is mode:                 # only ever pop a mode on top
                self._mode = None
                mode.__exit__(None, None, None)
                _drop_inert_modes()
            else:
                mode.tracer = _PASS_THROUGH           # another mode sits above ours: paused

    def close(self) -> None:
        """Remove the hooks and the mode (idempotent; a mode under another mode stays inert until it is on top)."""
        self.intercept(False)
        if self._mode is not None:
            self._mode.owner, self._mode = None, None
        self.modules(False)
        _steps_aside_in_backward(self, False)
        self._end_replay()
        self._stack.clear()
        self._grads.clear()
        self._recompute = None
        self.forget_graph()

    def forget_graph(self) -> None:
        """Drop the forward-op table of autograd nodes (call when a step's backward passes are done)."""
        self._nodes.clear()
        self._hooked.clear()
        self._functions.clear()
        self._hooked_functions.clear()

    def busy(self):
        """A context in which the client's own tensor operations pass through without interception."""
        return _Busy(self._busy)

    def backward_done(self) -> None:
        """A backward pass of the run (not of the client's own work) ended: tell the client, if it listens."""
        done = getattr(self.client, "backward_done", None)
        if done is not None and not self.is_busy():
            done()

    def is_busy(self) -> bool:
        """Whether the client's own work (a shadow replay, a count) is running on this thread."""
        return getattr(self._busy, "on", False)

    # -------------------------------------------------------------- modules
    def outermost(self) -> bool:
        """Whether no module is running (in `client.module_output`: the module that just ran was outermost; a
        forward recomputed in backward ran inside its caller)."""
        return not self._stack and not self._replaying

    def current_module(self) -> str:
        return self._stack[-1] if self._stack else OUTSIDE

    def module_grad(self) -> bool:
        """Whether grad was on when the innermost running module started (True outside every module). Under
        no_grad, autocast casts a weight with grad on (its cast cache then serves grad regions too): an op of a
        module that started without grad is no training op, whatever grad mode it saw."""
        return self._grads[-1] if self._grads else True

    def _on_pre(self, module, args):
        if self._is_compiling():
            return
        grad = self._grad_enabled()
        if grad:
            if self._recompute is None and self._graph_task() != -1 and not self.is_busy():
                self._recomputed()
        elif self._mode is not None:
            sequence = self._next_sequence()
            if sequence != self._last_sequence:
                self._in_function(sequence)
        name = self.names.get(module)
        if name is None:
            try:
                name = self.names.adopt(module)
            except Exception as err:  # never break the run
                self.error = err
                name = type(module).__name__
        self._stack.append(name)
        self._grads.append(grad)

    def _on_post(self, module, args, output):
        if self._is_compiling() or not self._stack:
            return
        name = self._stack.pop()
        self._grads.pop()
        recompute = self._recompute
        if self.is_busy() or (name == OUTSIDE and self.names.is_outside(module)):
            pass
        elif recompute is None:                       # (else the recomputation of what was counted: not again)
            self.client.module_output(name, module, output)
        if recompute is not None and len(self._stack) <= recompute:
            self._recompute = None

    # ------------------------------------------------------- recomputation
    def _in_function(self, sequence: int) -> None:
        """Something made an autograd node while grad is off: an autograd Function, in whose forward the module or
        op now starting runs. Where the Function recomputes that forward in its backward (a reentrant
        checkpoint), the recomputation runs under the modules running now (`_recomputed`)."""
        self._last_sequence = sequence
        if len(self._functions) >= MAX_NODES:
            self._functions.clear()
        self._functions[sequence - 1] = (tuple(self._stack), tuple(self._grads))

    def _recomputed(self) -> None:
        """A module starts with grad on inside a backward pass: activation checkpointing recomputes a forward.

        A non-reentrant checkpoint's forward ran with grad, and was heard of then: its recomputation (under
        torch's recomputation hooks) is not: module outputs are skipped until the module returns, and ops too
        (the mode, popped for the backward pass, sees none; inside a replay it skips them). A reentrant
        checkpoint ran its forward without grad, in an autograd Function's, and nothing of it was heard of: its
        recomputation, in the Function's backward, is the forward (a replay: `_replay_function`, here unless the
        Function's node hook began it already)."""
        if _under_recomputation_hooks():
            self._recompute = len(self._stack)
        elif not self._replaying:
            node = self._current_node()
            if isinstance(node, self._function_node):
                self._replay_function(node)

    def _hook_function(self, node, sequence: int) -> None:
        """Hooks on the node of an autograd Function whose forward ran without grad (its output is consumed now):
        a replay while its backward runs, which may recompute that forward (a reentrant checkpoint). A tracer
        that wants backward ops hears that backward as backward ops, as before."""
        self._hooked_functions.add(sequence)
        if not self._backward_wanted and isinstance(node, self._function_node):
            node.register_prehook(self._on_function_backward)
            node.register_hook(self._on_function_backward_end)

    def _on_function_backward(self, grads):
        if not self._replaying and not self.is_busy():
            self._replay_function(self._current_node())
        return None

    def _on_function_backward_end(self, grad_inputs, grad_outputs):
        self._end_replay()
        return None

    def _replay_function(self, node) -> None:
        """The backward of an autograd Function whose forward ran without grad begins: what it recomputes with
        grad (a reentrant checkpoint's forward) is the forward the client hears of, its ops forward ops (the
        mode, popped for the backward pass, is back until `_end_replay`), under the modules that ran the
        Function's forward, and their nodes are the ones its own backward call goes through. (Its other ops, run
        without grad, are no forward ops of the run: the clients count none.)"""
        if node is None or self not in _BACKWARD_ASIDE:   # (the engine call ends a replay: enlisted tracers only,
            return                                        #  while attached)
        caller = self._functions.get(node._sequence_nr())
        pushed = None
        if self._aside and self._mode is not None:
            pushed = self._mode
            pushed.__enter__()
            self._aside = False
        self._replay = (self._stack, self._grads, pushed)
        self._stack, self._grads = (list(caller[0]), list(caller[1])) if caller else (list(self._stack),
                                                                                     list(self._grads))
        self._replaying = True

    def _end_replay(self, roots=()) -> None:
        """A reentrant checkpoint's recomputation ended (its backward call starts, with `roots`, the recomputed
        outputs, whose nodes get their gradient pre-hook: the call hands them the gradients that the forward's
        later ops would have had); the mode steps aside again for the rest of the backward pass."""
        replay, self._replay, self._replaying = self._replay, None, False
        if replay is None:
            return
        self._stack, self._grads, pushed = replay
        if roots and self._grad_wanted:
            self._hook_inputs(roots)
        if pushed is not None and self._mode is pushed and _top_mode() is pushed:
            pushed.__exit__(None, None, None)
            self._aside = True

    # ------------------------------------------------------------------ ops
    def _hook_inputs(self, args) -> None:
        """Give the autograd node of every observed op output this op consumes a gradient pre-hook (once)."""
        for a in args:
            if isinstance(a, (list, tuple)):
                self._hook_inputs(a)
                continue
            node = getattr(a, "grad_fn", None)
            if node is not None:
                self._hook_node(node)

    def _hook_node(self, node):
        """The tags of a node made by an observed op, pre-hooked now if it was not (None for other nodes; the node
        of an autograd Function whose forward ran without grad gets the hooks of `_hook_function`)."""
        sequence = node._sequence_nr()
        tags = self._hooked.get(sequence)
        if tags is None:
            if sequence not in self._nodes:
                if sequence in self._functions and sequence not in self._hooked_functions:
                    self._hook_function(node, sequence)
                return None
            tags = self._hooked[sequence] = []
            node.register_prehook(self._prehook)
        return tags

    def hook_output(self, tensor, tag) -> bool:
        """Hand the gradient of `tensor` to client.tagged_grad(tag, grad) too, through its node's pre-hook.

        False when `tensor` is not the output of an observed op (then nothing is hooked).
        """
        node = tensor.grad_fn
        tags = self._hook_node(node) if node is not None else None
        if tags is None:
            return False
        tags.append((tensor.output_nr, tag))
        return True

    def _on_node_grads(self, grads):
        """The pre-hook of every node hooked (one function for all: the node is the one running)."""
        node = self._current_node()
        if node is None or self.is_busy():
            return None
        sequence = node._sequence_nr()
        site, tags = self._nodes.get(sequence), self._hooked.get(sequence, ())
        tensors = [g for g in grads if g is not None and (g.is_floating_point() or g.is_complex())]
        if tensors and site is not None:
            self.client.output_grad(site, tensors)
        for index, tag in tags:
            grad = grads[index]
            if grad is not None and (grad.is_floating_point() or grad.is_complex()):
                self.client.tagged_grad(tag, grad)
        return None

    def _pass_on(self, args, consumes: bool) -> None:
        """A skipped forward op: if it made an autograd node, the next observed op does not take that node for
        its own; and if it consumes its inputs (a view or a copy), the observed ops whose outputs it consumes get
        their gradient pre-hook, as a later op's inputs would (a Linear on 3-D input is addmm and a view: the
        view alone consumes addmm's output). One that passes no gradient back (ones_like, the seed of
        loss.backward(); detach; item()) hooks nothing: the loss it reads keeps no gradient."""
        sequence = self._next_sequence()
        if sequence != self._last_sequence and not self._grad_enabled():
            self._in_function(sequence)
        self._last_sequence = sequence
        if consumes and self._grad_wanted:
            self._hook_inputs(args)

    def _on_op(self, func, out, args=(), kwargs=None):
        op = _OP_NAMES.get(func, False)
        if op is False:
            op = _OP_NAMES[func] = _op_name(func)
        if self.is_busy():
            return out
        if not op:                                    # skipped (None: a view or a copy)
            if self._replaying or self._current_node() is None:
                self._pass_on(args, op is None)
            return out
        outputs = _float_outputs(out, self._tensor)
        if not outputs:
            return out
        node = self._current_node()
        if node is None or self._replaying:          # (replaying: a forward recomputed in backward)
            if node is not None and self._recompute is not None:
                return out                            # (a non-reentrant checkpoint's recomputation, in a replay)
            if len(outputs) > 1:
                outputs = _low_precision_outputs(func, args, kwargs, outputs)
                if not outputs:
                    return out
            module = self._stack[-1] if self._stack else OUTSIDE
            site = self._sites.get((module, op))
            if site is None:
                site = self._sites[(module, op)] = Site(module, op)
            sequence = self._next_sequence()
            if sequence != self._last_sequence:      # an autograd node was made: by this op, if grad is on
                if not self._grad_enabled():         # (else an autograd Function's, whose forward this op is in)
                    self._in_function(sequence)
                else:
                    self._last_sequence = sequence
                    if len(self._nodes) >= MAX_NODES:
                        self.forget_graph()
                    self._nodes[sequence - 1] = site
            if self._grad_wanted:
                self._hook_inputs(args)
            handler = self.client.forward_op
        else:
            site = self._nodes.get(node._sequence_nr()) if self._backward_wanted else None
            if site is None:                          # a node no observed forward op made (compiled code)
                return out
            handler = self.client.backward_op
        self._busy.on = True
        try:
            new = handler(site, outputs)
        finally:
            self._busy.on = False
        return out if new is None else _replace(out, outputs, new)


_BACKWARD_ASIDE: list = []
"""Attached tracers whose mode steps aside while autograd's engine runs."""
_ENGINE_RUN_BACKWARD: list = []
"""torch.autograd's own _engine_run_backward (kept once it has been wrapped)."""


def _steps_aside_in_backward(tracer, on: bool) -> None:
    """Enlist or release a tracer; the engine call is wrapped while any tracer is enlisted.

    Without torch.autograd._engine_run_backward (an internal name), backward ops
    pass through the mode and are dropped there: slower, the same counts.
    """
    import torch.autograd

    if on and tracer not in _BACKWARD_ASIDE:
        engine = getattr(torch.autograd, "_engine_run_backward", None)
        if not _BACKWARD_ASIDE and engine is not None and engine is not _run_backward_aside:
            _ENGINE_RUN_BACKWARD[:] = [engine]
            torch.autograd._engine_run_backward = _run_backward_aside
        _BACKWARD_ASIDE.append(tracer)
    elif not on and tracer in _BACKWARD_ASIDE:
        _BACKWARD_ASIDE.remove(tracer)
        if not _BACKWARD_ASIDE and getattr(torch.autograd, "_engine_run_backward", None) is _run_backward_aside:
            torch.autograd._engine_run_backward = _ENGINE_RUN_BACKWARD[0]


def _run_backward_aside(*args, **kwargs):
    """torch.autograd's engine call, with the enlisted tracers' modes popped while it runs (those on top, inert ones
    for good), and each enlisted tracer told when a backward pass of the run ends (Tracer.backward_done): not when
    the call is nested inside another backward pass (a reentrant checkpoint's). torch.compile's own engine runs
    (AOTAutograd tracing a backward graph on fake tensors, on a compile that misses its cache) are not the run's:
    they pass."""
    import torch

    if torch.compiler.is_compiling():
        return _ENGINE_RUN_BACKWARD[0](*args, **kwargs)
    outermost = torch._C._current_graph_task_id() == -1
    for tracer in _BACKWARD_ASIDE:           # a reentrant checkpoint's backward call: its recomputation ended
        if tracer._replaying:
            tracer._end_replay(args[0] if args else kwargs.get("t_outputs", ()))
    popped = []
    while True:
        mode = _top_mode()
        if _MODE_CLASS is None or not isinstance(mode, _MODE_CLASS):
            break
        tracer = mode.tracer
        if tracer is _PASS_THROUGH:
            _drop(mode)
            continue
        if tracer._backward_wanted or tracer._mode is not mode:
            break
        mode.__exit__(None, None, None)
        popped.append((tracer, mode, tracer._aside))
        tracer._aside = True
    try:
        result = _ENGINE_RUN_BACKWARD[0](*args, **kwargs)
        if outermost:
            _end_replays()
            for tracer in list(_BACKWARD_ASIDE):    # (before the modes are back: the clients' work is not the run's)
                tracer.backward_done()
        return result
    finally:
        if outermost:
            _end_replays()
        for tracer, mode, aside in reversed(popped):
            tracer._aside = aside
            if tracer._mode is mode:       # not switched off meanwhile
                mode.__enter__()


def _end_replays() -> None:
    """End the replays still open when a backward pass ends (a Function that recomputed its forward without a
    backward call of its own)."""
    for tracer in _BACKWARD_ASIDE:
        tracer._end_replay()


def _top_mode():
    """The dispatch mode on top of torch's stack (None: none)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def _drop_inert_modes() -> None:
    """Pop every inert tracer mode on top of torch's stack (a mode goes inert when its tracer stops intercepting
    while another mode sits above it: paused, or for good once the tracer closed)."""
    if _MODE_CLASS is None:
        return
    while True:
        mode = _top_mode()
        if not isinstance(mode, _MODE_CLASS) or mode.tracer is not _PASS_THROUGH:
            return
        _drop(mode)


def _drop(mode) -> None:
    """Pop an inert mode that is on top of torch's stack; a paused tracer whose mode it was pushes a new one when
    interception resumes."""
    mode.__exit__(None, None, None)
    owner = mode.owner
    if owner is not None and owner._mode is mode:
        owner._mode = None


def _under_recomputation_hooks() -> bool:
    """Whether torch's non-reentrant checkpoint is recomputing a forward (its saved-tensor hooks are on top)."""
    import torch

    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks = top(True) if top is not None else None
    return bool(hooks) and getattr(hooks[0], "__qualname__", "").startswith("_recomputation_hook.")


class _Busy:
    """Flags the client's own work and switches Python dispatch off for it (its ops are not the run's)."""

    def __init__(self, flag):
        self.flag = flag

    def __enter__(self):
        import torch

        self.before = getattr(self.flag, "on", False)
        self.flag.on = True
        self.guard = torch._C._DisableTorchDispatch()
        self.guard.__enter__()

    def __exit__(self, *exc):
        self.guard.__exit__(*exc)
        self.flag.on = self.before
        return False


class _PassThrough:
    """What an inert mode (one that could not be popped) hands its ops to: nothing."""

    def _on_op(self, func, out, args=(), kwargs=None):
        return out


_PASS_THROUGH = _PassThrough()
