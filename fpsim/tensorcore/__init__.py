"""Tensor-core models: block-FMA dot products as NVIDIA GPUs compute them, and the tools that check them.

The model: `blockfma` (one block FMA and one instruction), `devices` (every
device fact: generations, MMA instructions, parameters), `accumulation` (how
partial sums meet over K, and reference summations), `core` (TensorCore).

Checking it: `probes` (designed rows) and `features` (what their results show);
`captures` (the capture file), `upstream` (the upstream text layout) and
`validate` (capture against model); the GPU capture tool `gpu_capture` with
`fragments`, `kernels`, `library_capture` and `samples` (`fpsim capture`).
"""
