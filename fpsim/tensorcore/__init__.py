"""Tensor-core models: block-FMA dot products as NVIDIA GPUs compute them."""
