"""Calls of autocast-policy ops for the policy tests: inputs synthesised from each op's schema.

Every call is an aten op called directly (autocast acts at the aten level). Tensors get a
shape that suits the op (symmetric positive definite 4x4 matrices for linear algebra, images
for convolutions and pooling, ...); the floating inputs come in the dtype mix a test asks for.
"""

from __future__ import annotations

import torch

from fpsim.emulate.autocast import resolve_op

SPECIAL = {
    # op: (args as a function of make(shape) for floating tensors; long targets are literal)
    "nll_loss": lambda f: (f((4, 5)).log_softmax(-1), torch.tensor([0, 1, 2, 3])),
    "nll_loss2d": lambda f: (f((2, 5, 3, 3)).log_softmax(1), torch.zeros(2, 3, 3, dtype=torch.long)),
    "cross_entropy_loss": lambda f: (f((4, 5)), torch.tensor([0, 1, 2, 3])),
    "multi_margin_loss": lambda f: (f((4, 5)), torch.tensor([0, 1, 2, 3])),
    "multilabel_margin_loss": lambda f: (f((4, 5)), torch.zeros(4, 5, dtype=torch.long)),
    "multilabel_margin_loss_forward": lambda f: (f((4, 5)), torch.zeros(4, 5, dtype=torch.long), 1),
    "linear": lambda f: (f((3, 4)), f((5, 4)), f((5,))),
    "mm": lambda f: (f((3, 4)), f((4, 5))),
    "bmm": lambda f: (f((2, 3, 4)), f((2, 4, 5))),
    "matmul": lambda f: (f((2, 3, 4)), f((4, 5))),
    "addmm": lambda f: (f((5,)), f((3, 4)), f((4, 5))),
    "_addmm_activation": lambda f: (f((5,)), f((3, 4)), f((4, 5))),
    "baddbmm": lambda f: (f((2, 3, 5)), f((2, 3, 4)), f((2, 4, 5))),
    "addbmm": lambda f: (f((3, 5)), f((2, 3, 4)), f((2, 4, 5))),
    "mv": lambda f: (f((3, 4)), f((4,))),
    "addmv": lambda f: (f((3,)), f((3, 4)), f((4,))),
    "addr": lambda f: (f((3, 4)), f((3,)), f((4,))),
    "dot": lambda f: (f((4,)), f((4,))),
    "vdot": lambda f: (f((4,)), f((4,))),
    "linalg_vecdot": lambda f: (f((3, 4)), f((3, 4))),
    "einsum": lambda f: ("ij,jk->ik", [f((3, 4)), f((4, 5))]),
    "chain_matmul": lambda f: ([f((3, 4)), f((4, 5)), f((5, 2))],),
    "linalg_multi_dot": lambda f: ([f((3, 4)), f((4, 5)), f((5, 2))],),
    "tensordot": lambda f: (f((3, 4)), f((4, 5)), [1], [0]),
    "conv1d": lambda f: (f((2, 3, 8)), f((4, 3, 3))),
    "conv1d.padding": lambda f: (f((2, 3, 8)), f((4, 3, 3)), None, [1], "same"),
    "conv2d": lambda f: (f((2, 3, 8, 8)), f((4, 3, 3, 3))),
    "conv2d.padding": lambda f: (f((2, 3, 8, 8)), f((4, 3, 3, 3)), None, [1], "same"),
    "conv3d": lambda f: (f((1, 2, 4, 4, 4)), f((3, 2, 2, 2, 2))),
    "conv3d.padding": lambda f: (f((1, 2, 4, 4, 4)), f((3, 2, 2, 2, 2)), None, [1], "same"),
    "conv_transpose1d": lambda f: (f((2, 3, 8)), f((3, 4, 3))),
    "conv_transpose2d.input": lambda f: (f((2, 3, 8, 8)), f((3, 4, 3, 3))),
    "conv_transpose3d.input": lambda f: (f((1, 2, 4, 4, 4)), f((2, 3, 2, 2, 2))),
    "convolution": lambda f: (f((2, 3, 8, 8)), f((4, 3, 3, 3)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
    "_convolution": lambda f: (f((2, 3, 8, 8)), f((4, 3, 3, 3)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                               False, False, True, True),
    "_convolution.deprecated": lambda f: (f((2, 3, 8, 8)), f((4, 3, 3, 3)), None, [1, 1], [0, 0], [1, 1], False,
                                          [0, 0], 1, False, False, True),
    "conv_tbc": lambda f: (f((5, 2, 3)), f((3, 3, 4)), f((4,))),
    "prelu": lambda f: (f((2, 3, 4)), f((3,))),
    "layer_norm": lambda f: (f((3, 4)), [4], f((4,)), f((4,))),
    "native_layer_norm": lambda f: (f((3, 4)), [4], f((4,)), f((4,)), 1e-5),
    "rms_norm": lambda f: (f((3, 4)), [4], f((4,))),
    "group_norm": lambda f: (f((2, 4, 3)), 2, f((4,)), f((4,))),
    "softmax.int": lambda f: (f((3, 4)), -1),
    "log_softmax.int": lambda f: (f((3, 4)), -1),
    "sum.dim_IntList": lambda f: (f((3, 4)), [1]),
    "prod.dim_int": lambda f: (f((3, 4)), 1),
    "cumsum": lambda f: (f((3, 4)), 1),
    "cumprod": lambda f: (f((3, 4)), 1),
    "logsumexp": lambda f: (f((3, 4)), [1]),
    "frobenius_norm.dim": lambda f: (f((3, 4)), [1]),
    "nuclear_norm.dim": lambda f: (f((3, 4)), [0, 1]),
    "linalg_matrix_norm.str_ord": lambda f: (f((3, 4)),),
    "norm.ScalarOpt_dim": lambda f: (f((3, 4)), 2, [1]),
    "pow.Tensor_Scalar": lambda f: (f((3, 4)).abs(), 2.5),
    "pow.Scalar": lambda f: (2.5, f((3, 4))),
    "pow.Tensor_Tensor": lambda f: (f((3, 4)).abs(), f((3, 4))),
    "renorm": lambda f: (f((3, 4)), 2, 0, 1.0),
    "index_put": lambda f: (f((4, 3)), [torch.tensor([0, 2])], f((2, 3))),
    "scatter_add": lambda f: (f((4, 3)), 0, torch.zeros(2, 3, dtype=torch.long), f((2, 3))),
    "index_copy": lambda f: (f((4, 3)), 0, torch.tensor([0, 2]), f((2, 3))),
    "cat": lambda f: ([f((2, 3)), f((2, 3))],),
    "stack": lambda f: ([f((2, 3)), f((2, 3))],),
    "cross": lambda f: (f((4, 3)), f((4, 3))),
    "bilinear": lambda f: (f((3, 4)), f((3, 5)), f((2, 4, 5))),
    "cosine_similarity": lambda f: (f((3, 4)), f((3, 4))),
    "cdist": lambda f: (f((3, 4)), f((5, 4))),
    "dist": lambda f: (f((3, 4)), f((3, 4))),
    "margin_ranking_loss": lambda f: (f((4,)), f((4,)), f((4,)).sign()),
    "cosine_embedding_loss": lambda f: (f((3, 4)), f((3, 4)), f((3,)).sign()),
    "triplet_margin_loss": lambda f: (f((3, 4)), f((3, 4)), f((3, 4))),
    "hinge_embedding_loss": lambda f: (f((3, 4)), f((3, 4)).sign()),
    "binary_cross_entropy": lambda f: (f((3, 4)).sigmoid(), f((3, 4)).sigmoid()),
    "grid_sampler": lambda f: (f((1, 2, 4, 4)), f((1, 3, 3, 2)).tanh(), 0, 0, False),
    "scaled_dot_product_attention": lambda f: (f((1, 2, 4, 8)), f((1, 2, 4, 8)), f((1, 2, 4, 8))),
    "upsample_nearest1d": lambda f: (f((1, 2, 4)), [8]),
    "upsample_nearest2d": lambda f: (f((1, 2, 4, 4)), [8, 8]),
    "upsample_nearest3d": lambda f: (f((1, 2, 4, 4, 4)), [8, 8, 8]),
    "_upsample_nearest_exact1d": lambda f: (f((1, 2, 4)), [8]),
    "_upsample_nearest_exact2d": lambda f: (f((1, 2, 4, 4)), [8, 8]),
    "_upsample_nearest_exact3d": lambda f: (f((1, 2, 4, 4, 4)), [8, 8, 8]),
    "upsample_linear1d": lambda f: (f((1, 2, 4)), [8], False),
    "upsample_bilinear2d": lambda f: (f((1, 2, 4, 4)), [8, 8], False),
    "_upsample_bilinear2d_aa": lambda f: (f((1, 2, 4, 4)), [8, 8], False),
    "upsample_trilinear3d": lambda f: (f((1, 2, 4, 4, 4)), [8, 8, 8], False),
    "upsample_bicubic2d": lambda f: (f((1, 2, 4, 4)), [8, 8], False),
    "_upsample_bicubic2d_aa": lambda f: (f((1, 2, 4, 4)), [8, 8], False),
    "avg_pool3d": lambda f: (f((1, 2, 4, 4, 4)), [2, 2, 2]),
    "max_pool3d": lambda f: (f((1, 2, 4, 4, 4)), [2, 2, 2]),
    "adaptive_avg_pool3d": lambda f: (f((1, 2, 4, 4, 4)), [2, 2, 2]),
    "adaptive_max_pool3d": lambda f: (f((1, 2, 4, 4, 4)), [2, 2, 2]),
    "reflection_pad1d": lambda f: (f((1, 2, 4)), [1, 1]),
    "reflection_pad2d": lambda f: (f((1, 2, 4, 4)), [1, 1, 1, 1]),
    "replication_pad1d": lambda f: (f((1, 2, 4)), [1, 1]),
    "replication_pad2d": lambda f: (f((1, 2, 4, 4)), [1, 1, 1, 1]),
    "replication_pad3d": lambda f: (f((1, 2, 4, 4, 4)), [1, 1, 1, 1, 1, 1]),
    "quantile": lambda f: (f((8,)), f((2,)).sigmoid()),
    "nanquantile": lambda f: (f((8,)), f((2,)).sigmoid()),
    "quantile.scalar": lambda f: (f((8,)), 0.5),
    "nanquantile.scalar": lambda f: (f((8,)), 0.5),
    "polar": lambda f: (f((4,)).abs(), f((4,))),
    "view_as_complex": lambda f: (f((4, 2)),),
    "stft": lambda f: (f((64,)), 16, None, None, None, False, None, True),
    "stft.center": lambda f: (f((64,)), 16, None, None, None, True, "reflect", False, None, True),
    "fake_quantize_per_tensor_affine": lambda f: (f((3, 4)), 0.1, 0, -128, 127),
    "trace": lambda f: (f((4, 4)),),
    "max_unpool2d": lambda f: (f((1, 1, 2, 2)), torch.tensor([[[[0, 3], [8, 11]]]]), [4, 4]),
    "max_unpool3d": lambda f: (f((1, 1, 1, 2, 2)), torch.tensor([[[[[0, 3], [8, 11]]]]]), [1, 4, 4], [1, 1, 1],
                               [0, 0, 0]),
    "fractional_max_pool2d": lambda f: (f((1, 1, 4, 4)), [2, 2], [2, 2], f((1, 1, 2)).sigmoid()),
    "fractional_max_pool3d": lambda f: (f((1, 1, 4, 4, 4)), [2, 2, 2], [2, 2, 2], f((1, 1, 3)).sigmoid()),
    "ctc_loss.IntList": lambda f: (f((6, 1, 4)).log_softmax(-1), torch.tensor([[1, 2]]), [6], [2]),
    "ctc_loss.Tensor": lambda f: (f((6, 1, 4)).log_softmax(-1), torch.tensor([[1, 2]]), torch.tensor([6]),
                                  torch.tensor([2])),
    "grid_sampler_2d": lambda f: (f((1, 2, 4, 4)), f((1, 3, 3, 2)).tanh(), 0, 0, False),
    "_grid_sampler_2d_cpu_fallback": lambda f: (f((1, 2, 4, 4)), f((1, 3, 3, 2)).tanh(), 0, 0, False),
    "grid_sampler_3d": lambda f: (f((1, 2, 4, 4, 4)), f((1, 3, 3, 3, 3)).tanh(), 0, 0, False),
    "ormqr": lambda f: (f((4, 4)), f((4,)), f((4, 4))),
    "orgqr": lambda f: (f((4, 4)), f((4,))),
    "linalg_householder_product": lambda f: (f((4, 4)), f((4,))),
    "lu_solve": lambda f: (f((4, 4)), f((4, 4)), torch.arange(1, 5, dtype=torch.int32)),
    "triangular_solve": lambda f: (f((4, 4)), f((4, 4)) + 4 * torch.eye(4)),
    "linalg_tensorsolve": lambda f: (f((4, 4)) + 4 * torch.eye(4), f((4,))),
    "linalg_lstsq": lambda f: (f((4, 4)), f((4, 2))),
    "linalg_solve": lambda f: (f((4, 4)) + 4 * torch.eye(4), f((4, 2))),
    "cholesky_solve": lambda f: (f((4, 2)), torch.linalg.cholesky(_spd())),
    "linalg_matrix_rank.atol_rtol_float": lambda f: (f((4, 4)),),
    "linalg_matrix_rank.atol_rtol_tensor": lambda f: (f((4, 4)),),
    "linalg_matrix_rank.tol_tensor": lambda f: (f((4, 4)), f(()).abs()),
    "linalg_matrix_rank": lambda f: (f((4, 4)), 0.1),
    "linalg_cond.p_str": lambda f: (f((4, 4)) + 4 * torch.eye(4), "fro"),
    "_lu_with_info": lambda f: (f((4, 4)),),
    "linalg_tensorinv": lambda f: (f((4, 4)) + 4 * torch.eye(4), 1),
    "linalg_matrix_norm": lambda f: (f((3, 4)), 2),
    "poisson_nll_loss": lambda f: (f((3, 4)), f((3, 4)).abs(), True, False, 1e-8, 1),
    "fft_fft2": lambda f: (f((4, 4)),),
    "fft_ifft2": lambda f: (f((4, 4)),),
    "fft_rfft2": lambda f: (f((4, 4)),),
    "fft_irfft2": lambda f: (f((4, 4)),),
    "_native_multi_head_attention": lambda f: (f((1, 3, 4)), f((1, 3, 4)), f((1, 3, 4)), 4, 2, f((12, 4)),
                                               f((12,)), f((4, 4)), f((4,))),
    "_scaled_dot_product_flash_attention": lambda f: (f((1, 2, 4, 8)), f((1, 2, 4, 8)), f((1, 2, 4, 8))),
    "lstm_cell": lambda f: (f((2, 3)), [f((2, 4)), f((2, 4))], f((16, 3)), f((16, 4))),
    "gru_cell": lambda f: (f((2, 3)), f((2, 4)), f((12, 3)), f((12, 4))),
    "rnn_tanh_cell": lambda f: (f((2, 3)), f((2, 4)), f((4, 3)), f((4, 4))),
    "rnn_relu_cell": lambda f: (f((2, 3)), f((2, 4)), f((4, 3)), f((4, 4))),
    "_thnn_fused_lstm_cell": lambda f: (f((2, 16)), f((2, 16)), f((2, 4))),
    "_thnn_fused_gru_cell": lambda f: (f((2, 12)), f((2, 12)), f((2, 4))),
}

SQUARE_FAMILY = ("cholesky", "inverse", "pinverse", "linalg_", "geqrf", "qr", "svd", "cholesky_inverse")


def _spd():
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    return a @ a.T + 4 * torch.eye(4)


def arguments(name: str, make):
    """The arguments of a call of op `name`, floating tensors from make(shape); None if no recipe fits."""
    if name in SPECIAL:
        return SPECIAL[name](make)
    base = name.split(".")[0]
    op = resolve_op(name)
    if op is None:
        return None
    required = [a for a in op._schema.arguments if not a.has_default_value() and not a.kwarg_only]
    if not all(str(a.type) == "Tensor" for a in required):
        return None
    if base.startswith(SQUARE_FAMILY):
        return tuple(make((4, 4), spd=True) for _ in required)
    if base.startswith("fft_"):
        return (make((8,)),)
    return tuple(make((3, 4)) for _ in required)


def maker(dtypes, seed=0):
    """make(shape) giving CPU tensors whose dtypes cycle through `dtypes` (one per floating input, in order)."""
    g = torch.Generator().manual_seed(seed)
    count = [0]

    def make(shape, spd=False):
        dtype = dtypes[count[0] % len(dtypes)]
        count[0] += 1
        return (_spd() if spd else torch.randn(shape, generator=g)).to(dtype)

    return make


def on_fake_cuda(value):
    """`value` with every tensor replaced by a tensor of the same shape and dtype on CUDA (call inside a
    FakeTensorMode: fake CUDA tensors need no GPU, and torch's CUDA autocast kernels run on them)."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="cuda")
    if isinstance(value, (list, tuple)):
        return type(value)(on_fake_cuda(v) for v in value)
    return value
