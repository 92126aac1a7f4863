"""What of a tensor the watch counts: its values as a plain tensor with storage, real numbers only.

Most tensors a run makes are plain `torch.Tensor`s of real floats, counted as they are. Of the others:

- a DTensor (FSDP2's fully_shard, tensor parallelism): this rank's local part (the ranks are summed);
- a jagged nested tensor (`torch.nested`, layout=torch.jagged): its values buffer, every component's values;
- functorch's wrappers (inside `torch.vmap`, `torch.func.grad`), which have no storage: the tensor they wrap,
  under vmap the whole batch at once;
- another tensor subclass with storage of its own: that storage, read as a plain tensor;
- a complex tensor: its real and imaginary parts, each a float (`real_parts`), as FP16's complex32 (chalf)
  stores each part in FP16: 1e5j overflows FP16 as 1e5 does.

What cannot be read is left out, tensor by tensor, with the reason `plain_values` gives: a wrapper subclass
whose values live in tensors inside it (its own operations would be needed to read them, and the watch's work
runs with Python dispatch off), a tensor on the meta device (no values at all).
"""

from __future__ import annotations

MAX_DEPTH = 8
"""Wrappers around wrappers unwrapped at most (vmap inside vmap, a DTensor of a nested tensor)."""


def plain_values(tensor) -> tuple:
    """(a plain torch.Tensor with storage, holding the values of `tensor`, None), or (None, why it cannot be read:
    a phrase that completes "not counted: ...")."""
    import torch

    functorch = torch._C._functorch
    for _ in range(MAX_DEPTH):
        if tensor.__class__ is not torch.Tensor and tensor.__class__ is not torch.nn.Parameter:
            local = getattr(tensor, "_local_tensor", None)      # DTensor: this rank's part
            if local is not None:
                tensor = local
                continue
            if tensor.is_nested:
                values = getattr(tensor, "_values", None)      # jagged: the buffer of every component's values
                if values is None:
                    return None, f"{type(tensor).__name__}, a nested tensor without a values buffer"
                tensor = values
                continue
        if functorch.is_functorch_wrapped_tensor(tensor):       # vmap's BatchedTensor, torch.func's TensorWrapper
            tensor = functorch.get_unwrapped(tensor)
            continue
        # read as a plain tensor from here: no Python code of a subclass runs
        plain = tensor if tensor.__class__ is torch.Tensor else tensor.as_subclass(torch.Tensor)
        if plain.is_meta:
            return None, "tensors on the meta device (no values)"
        try:
            address = plain.data_ptr()
        except RuntimeError:
            address = 0
        if not address and plain.numel():      # no storage of its own
            return None, (f"{type(tensor).__name__}, a tensor subclass whose values are in tensors inside it "
                          f"(only its own operations read them)")
        return plain, None                      # a subclass holding its values: they are its storage
    return None, f"{type(tensor).__name__} wrapped more than {MAX_DEPTH} deep"


def real_parts(tensor):
    """A complex tensor as the real tensor of its real and imaginary parts (a last dimension of 2, a view where
    torch can make one); any other tensor as it is."""
    import torch

    if not tensor.is_complex():
        return tensor
    return torch.view_as_real(tensor.resolve_conj() if tensor.is_conj() else tensor)


def widened(tensor):
    """A tensor in float32, a complex one in complex64 (each part float32)."""
    import torch

    return tensor.to(torch.complex64) if tensor.is_complex() else tensor.float()
