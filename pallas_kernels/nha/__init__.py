"""Native hybrid attention (NHA) in Pallas: GPU (Triton lowering) and TPU (Mosaic) kernels.

Entry points: `api.native_hybrid_attention` (differentiable) and `api.unsupported` /
`api.is_supported` (for `implementation=` dispatch in `hybrid_jax.ops.nha`).
"""
