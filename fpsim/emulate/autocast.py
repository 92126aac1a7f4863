"""A device type's autocast policy, applied by torch's own autocast machinery on another device.

torch.autocast applies its policy at the dispatcher's Autocast key, above autograd, so that
its casts are recorded and low-precision ops save low-precision tensors for backward. To run
the CUDA policy on the CPU, `PolicyKernels` registers, for as long as it is entered, a Python
kernel on the running device's Autocast key (AutocastCPU) for every op of the target policy
(`fpsim.emulate.policy`), and a fallthrough for every op the key has a kernel for that the
target policy lacks; torch.autocast on the running device then behaves as on the target.
Leaving restores torch's own kernels. The registration is process-wide: other threads that
autocast on the same device meanwhile see the target policy too.

Op-level keeps ride on the same kernels: an op kept in FP32 in some modules (by the name
op-level observation gives it, `Module:op`) gets a kernel that casts its inputs to float32
when the innermost running module is one of those, and applies its usual rule elsewhere.
"""

from __future__ import annotations

import functools
import warnings

import torch

from .policy import APPEND_DTYPE_TARGETS, BANNED_MESSAGE, DECOMPOSED_FROM, cast_arguments, eligible, policy


@functools.lru_cache(maxsize=None)
def registered_ops(key_name: str) -> frozenset:
    """aten ops (``name.overload``, ``name`` for the default) that have a kernel on a dispatch key."""
    names = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        if qualified.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key_name):
            names.add(qualified[len("aten::"):])
    return frozenset(names)


def resolve_op(name: str):
    """The OpOverload of ``name.overload`` (or ``name``), or None where this torch has no such op."""
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def op_overloads(base: str) -> list:
    """Every overload of aten op `base` as ``name.overload`` strings (empty if there is no such op)."""
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return []
    return [base if o == "default" else f"{base}.{o}" for o in packet.overloads()]


class PolicyKernels:
    """Autocast kernels of policy `target` on `device_type`'s Autocast key, while entered (module doc).

    low: the low dtype (torch.float16 or torch.bfloat16). kept_ops: {aten op base name: set of
    module names where it stays in FP32}; current_module: a callable giving the innermost
    running module's name (needed when kept_ops is not empty).
    """

    def __init__(self, target: str, device_type: str, low, kept_ops: dict | None = None, current_module=None):
        self.rules = policy(target)
        self.device_type = device_type
        self.low = low
        self.key_name = "Autocast" + torch._C._dispatch_key_for_device(device_type)
        key = getattr(torch._C.DispatchKey, self.key_name)
        self._exclude = torch._C.DispatchKeySet(key)
        self._below = torch._C._dispatch_keyset_full_after(key)
        self.kept = _kept_by_op(kept_ops or {})
        self.current_module = current_module
        self._library = None

    def __enter__(self):
        library = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():   # torch warns once that it overrides its own kernels: we mean to
                warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
                for name in registered_ops(self.key_name) - set(self.rules) - set(self.kept):
                    library.impl(name, torch.library.fallthrough_kernel, self.key_name)
                for name in set(self.rules) | set(self.kept):
                    op = resolve_op(name)
                    if op is not None:
                        library.impl(name, self._kernel(name, op), self.key_name, with_keyset=True)
        except BaseException:
            library._destroy()
            raise
        self._library = library
        return self

    def __exit__(self, *exc):
        if self._library is not None:
            self._library._destroy()
            self._library = None
        return False

    def _kernel(self, name: str, op):
        rule = self.rules.get(name)
        kept_in = self.kept.get(name)

        def kernel(keyset, *args, **kwargs):
            if kept_in is not None and self.current_module() in kept_in:
                return self._apply("fp32", name, op, args, kwargs)
            if rule is not None:
                return self._apply(rule, name, op, args, kwargs)
            # an op kept elsewhere: on to the kernels below autocast, as autocast's fallthrough does
            if _numbers_for_tensors(op, args, kwargs):
                # the Python boundary turned a wrapped scalar into a number, which redispatch cannot take;
                # such an elementwise op calls no op autocast would act on, so skipping autocast is the same
                with torch._C._ExcludeDispatchKeyGuard(self._exclude):
                    return op(*args, **kwargs)
            return op.redispatch(keyset & self._below, *args, **kwargs)

        return kernel

    def _apply(self, rule: str, name: str, op, args, kwargs):
        if rule == "banned":
            raise RuntimeError(BANNED_MESSAGE)
        with torch._C._ExcludeDispatchKeyGuard(self._exclude):
            if rule == "fp32_append_dtype":
                target = resolve_op(APPEND_DTYPE_TARGETS[name])
                args = _with_defaults(op, args, kwargs)
                dtype = torch.float32 if eligible(args[0], self.device_type) else args[0].dtype
                return target(*args, dtype=dtype)
            args, kwargs = cast_arguments(rule, op._schema, args, kwargs, self.low, self.device_type)
            return op(*args, **kwargs)


def _kept_by_op(kept_ops: dict) -> dict:
    """{op overload name: module names} for every overload of each kept op and of the ops autocast
    sees in its place (policy.DECOMPOSED_FROM)."""
    kept: dict = {}
    for base, modules in kept_ops.items():
        names = op_overloads(base) + list(DECOMPOSED_FROM.get(base, ()))
        for name in names:
            kept.setdefault(name, set()).update(modules)
    return kept


def _numbers_for_tensors(op, args, kwargs) -> bool:
    """Whether a Tensor argument of the schema came as a Python number."""
    for i, argument in enumerate(op._schema.arguments):
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        if str(argument.type) == "Tensor" and isinstance(value, (bool, int, float, complex)):
            return True
    return False


def _with_defaults(op, args, kwargs) -> tuple:
    """Positional arguments with the schema's defaults filled in for those not given."""
    args = list(args)
    for argument in op._schema.arguments[len(args):]:
        if argument.kwarg_only:
            break
        args.append(kwargs[argument.name] if argument.name in kwargs else argument.default_value)
    return tuple(args)
