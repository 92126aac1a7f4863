"""torch.autocast's op policy: which ops run in the low format, which in FP32, which promote.

The tables are torch's own lists, transcribed from torch 2.13.0:

* ``CUDA``: the ``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``,
  ``AT_FORALL_FP32_SET_OPT_DTYPE``, ``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE`` and
  ``AT_FORALL_PROMOTE`` lists of aten/src/ATen/autocast_mode.h (shipped in the wheel as
  torch/include/ATen/autocast_mode.h), plus the extra ``KERNEL_CUDA`` lines and the ban on
  ``binary_cross_entropy`` of aten/src/ATen/autocast_mode.cpp;
* ``CPU``: the ``KERNEL_CPU`` lines of aten/src/ATen/autocast_mode.cpp.

tests/emulate/test_policy.py holds them to the installed torch: the op set equals the
dispatcher's Autocast registrations, and every op the tests can call behaves, dtype for dtype,
as real torch.autocast does (CPU on CPU tensors, CUDA on fake CUDA tensors).

Each op is named ``name.overload`` (``name`` alone for the default overload). The rules are
those of autocast_mode.h's ``WrapFunction_`` specialisations:

* ``lower_precision_fp``: every eligible tensor (floating, not float64, on the device) is cast
  to the low format (fp16 or bf16);
* ``fp32``: every eligible tensor is cast to float32;
* ``fp32_set_opt_dtype``: when the first argument is eligible, an unset ``dtype`` argument is
  set to float32 (inputs are not cast);
* ``fp32_append_dtype``: redispatched to the overload taking a dtype, float32 when the first
  argument is eligible, else its own dtype;
* ``promote``: every eligible tensor is cast to the widest eligible dtype among them;
* ``banned``: refused, with torch's message.

This module holds facts and casting rules only: installing them on the dispatcher is
`fpsim.emulate.autocast`.
"""

from __future__ import annotations

RULES = ("lower_precision_fp", "fp32", "fp32_set_opt_dtype", "fp32_append_dtype", "promote", "banned")

_CUDA_LOWER = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
    "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr",
    "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
    "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell",
    "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
    "cudnn_convolution", "cudnn_convolution_transpose",
)
_CUDA_FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d", "_upsample_nearest_exact2d",
    "upsample_nearest3d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
_CUDA_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
_CUDA_PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put", "tensordot",
    "scatter_add",
)

_CPU_LOWER = (
    "conv1d", "conv1d.padding", "conv2d", "conv2d.padding", "conv3d", "conv3d.padding", "bmm", "mm",
    "linalg_vecdot", "baddbmm", "addmm", "_addmm_activation", "addbmm", "linear", "_convolution.deprecated",
    "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "prelu", "scaled_dot_product_attention", "_native_multi_head_attention",
)
_CPU_FP32 = (
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "prod.dim_int", "quantile",
    "quantile.scalar", "nanquantile", "nanquantile.scalar", "stft", "stft.center", "cdist", "grid_sampler_2d",
    "_grid_sampler_2d_cpu_fallback", "grid_sampler_3d", "trace", "view_as_complex", "cholesky",
    "cholesky_inverse", "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d",
    "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d", "reflection_pad2d",
    "replication_pad1d", "replication_pad2d", "replication_pad3d", "mse_loss", "cosine_embedding_loss",
    "nll_loss", "nll_loss2d", "hinge_embedding_loss", "poisson_nll_loss", "smooth_l1_loss",
    "cross_entropy_loss", "l1_loss", "huber_loss", "margin_ranking_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "ctc_loss.IntList", "ctc_loss.Tensor", "kl_div",
    "multilabel_margin_loss", "binary_cross_entropy_with_logits", "fft_fft", "fft_ifft", "fft_fft2",
    "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft", "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn",
    "fft_irfftn", "fft_hfft", "fft_ihfft", "linalg_cond", "linalg_cond.p_str", "linalg_matrix_rank",
    "linalg_matrix_rank.tol_tensor", "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.atol_rtol_float",
    "linalg_solve", "linalg_cholesky", "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
    "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve", "fake_quantize_per_tensor_affine",
    "geqrf", "_lu_with_info", "qr", "svd", "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d",
    "adaptive_max_pool3d", "multilabel_margin_loss_forward", "linalg_qr", "linalg_cholesky_ex", "linalg_svd",
    "linalg_eig", "linalg_eigh", "linalg_lstsq", "linalg_inv_ex",
)
_CPU_PROMOTE = ("stack", "cat", "index_copy")

POLICIES = {
    "cuda": {
        "lower_precision_fp": _CUDA_LOWER, "fp32": _CUDA_FP32, "fp32_set_opt_dtype": _CUDA_SET_OPT_DTYPE,
        "fp32_append_dtype": ("norm.Scalar", "norm.ScalarOpt_dim"), "promote": _CUDA_PROMOTE,
        "banned": ("binary_cross_entropy",),
    },
    "cpu": {"lower_precision_fp": _CPU_LOWER, "fp32": _CPU_FP32, "promote": _CPU_PROMOTE},
}
"""Autocast policy per device type: rule -> op names (module doc)."""

APPEND_DTYPE_TARGETS = {"norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
"""fp32_append_dtype: the overload each op is redispatched to, with a dtype appended."""

BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")
"""What CUDA autocast raises for a banned op (autocast_mode.cpp's binary_cross_entropy_banned)."""

DECOMPOSED_FROM = {
    "addmm": ("linear", "matmul"), "mm": ("linear", "matmul", "einsum"), "bmm": ("matmul", "einsum"),
    "_unsafe_view": ("matmul",), "native_layer_norm": ("layer_norm",), "_softmax": ("softmax.int",),
    "_log_softmax": ("log_softmax.int",), "nll_loss_forward": ("nll_loss", "cross_entropy_loss"),
    "convolution": ("conv1d", "conv2d", "conv3d", "conv1d.padding", "conv2d.padding", "conv3d.padding"),
    "native_group_norm": ("group_norm",), "_fused_rms_norm": ("rms_norm",),
}
"""Ops as op-level observation names them (below autograd, after decomposition) -> the ops that
autocast sees in their place: keeping ``Module:addmm`` in FP32 keeps that module's linear call."""


def policy(device_type: str) -> dict:
    """The rule of every op of a device type's autocast policy: {op name: rule}."""
    if device_type not in POLICIES:
        raise ValueError(f"no autocast policy for device type {device_type!r}; known: {', '.join(POLICIES)}")
    return {op: rule for rule, ops in POLICIES[device_type].items() for op in ops}


# ------------------------------------------------------------------------ casting rules
def eligible(x, device_type: str) -> bool:
    """autocast_mode.h's is_eligible: a floating tensor on the device, not float64."""
    import torch

    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == device_type
            and x.dtype != torch.float64)


def cast_arguments(rule: str, schema, args: tuple, kwargs: dict, low, device_type: str):
    """(args, kwargs) as autocast's `rule` passes them on (module doc); low: the low dtype.
    Not for ``fp32_append_dtype`` and ``banned``, which change the op (see `fpsim.emulate.autocast`)."""
    import torch

    if rule == "lower_precision_fp":
        return _cast_all(args, kwargs, low, device_type)
    if rule == "fp32":
        return _cast_all(args, kwargs, torch.float32, device_type)
    if rule == "promote":
        return _cast_all(args, kwargs, _widest(list(args) + list(kwargs.values()), low, device_type), device_type)
    if rule == "fp32_set_opt_dtype":
        if not (args and eligible(args[0], device_type)):
            return args, kwargs
        args, kwargs = list(args), dict(kwargs)
        for i, argument in enumerate(schema.arguments):
            if argument.name != "dtype":
                continue
            if i < len(args):
                args[i] = torch.float32 if args[i] is None else args[i]
            elif kwargs.get("dtype") is None:
                kwargs["dtype"] = torch.float32
        return tuple(args), kwargs
    raise ValueError(f"cast_arguments does not apply to rule {rule!r}")


def _cast_all(args, kwargs, dtype, device_type: str):
    def cast(x):
        if isinstance(x, (list, tuple)):
            return type(x)(cast(t) for t in x)
        return x.to(dtype) if eligible(x, device_type) and x.dtype != dtype else x

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def _widest(values, low, device_type: str):
    """autocast_mode.h's promote_type: float32 if any eligible tensor is float32, else `low`."""
    import torch

    current = low
    for x in _flat(values):
        if not eligible(x, device_type):
            continue
        if current == torch.float32 or x.dtype == torch.float32:
            current = torch.float32
        elif x.dtype != low:
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def _flat(values):
    for value in values:
        if isinstance(value, (list, tuple)):
            yield from _flat(value)
        else:
            yield value
