"""The objects nested in a model's inputs and outputs, in the containers people pass them in.

Tuples (named ones too), lists, mappings (dict, OrderedDict, transformers'
BatchEncoding and ModelOutput) and dataclass instances are opened, down to
MAX_DEPTH; anything else is a leaf. torch's pytree knows no dataclass and no
UserDict: a batch passed as one would have been a single leaf, never copied,
halved or cast, and an output of one would have had no tensor to hook.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

MAX_DEPTH = 32
"""Containers nested deeper than this are leaves (and a container that holds itself ends there)."""


def is_subclass(tensor) -> bool:
    """A tensor subclass (a DTensor of FSDP2 or tensor parallelism, ...), not torch.Tensor or nn.Parameter: its
    values are not in its own storage, and its operations need Python dispatch."""
    import torch

    return type(tensor) not in (torch.Tensor, torch.nn.Parameter)


def leaves(tree) -> list:
    """Every leaf of `tree`, in order."""
    out: list = []
    _collect(tree, out, 0)
    return out


def float_tensors(tree) -> list:
    """The floating-point tensors among the leaves of `tree`, in order; complex ones too (their parts are
    floats, each stored in the format as FP16's complex32 stores them)."""
    import torch

    return [t for t in leaves(tree) if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]


def map_leaves(fn, tree):
    """`tree` with each leaf x replaced by fn(x): new containers of the same types; the leaves fn returns as
    they are (a container that cannot be copied stays as it is, and so do its leaves)."""
    return _map(fn, tree, 0)


def _children(tree):
    """The children of a container as (key, value) pairs, or None for a leaf."""
    if isinstance(tree, (list, tuple)):
        return list(enumerate(tree))
    if isinstance(tree, Mapping):
        return [(key, tree[key]) for key in tree]
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return [(f.name, getattr(tree, f.name)) for f in dataclasses.fields(tree)]
    return None


def _collect(tree, out: list, depth: int) -> None:
    children = _children(tree) if depth < MAX_DEPTH else None
    if children is None:
        out.append(tree)
        return
    for _, child in children:
        _collect(child, out, depth + 1)


def _map(fn, tree, depth: int):
    children = _children(tree) if depth < MAX_DEPTH else None
    if children is None:
        return fn(tree)
    values = [_map(fn, child, depth + 1) for _, child in children]
    try:
        if isinstance(tree, tuple):
            return type(tree)(*values) if hasattr(tree, "_fields") else type(tree)(values)
        if isinstance(tree, list):
            new = copy.copy(tree)
            new[:] = values
            return new
        new = copy.copy(tree)
        if isinstance(tree, Mapping):
            for (key, _), value in zip(children, values):
                new[key] = value
        else:   # a dataclass instance, frozen or not; __post_init__ does not run again
            for (name, _), value in zip(children, values):
                object.__setattr__(new, name, value)
        return new
    except Exception:   # a read-only mapping, a tuple subclass of another signature: as it is
        return tree
