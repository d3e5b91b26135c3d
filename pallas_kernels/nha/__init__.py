"""Native hybrid attention (NHA) in Pallas: GPU (Triton lowering) and TPU (Mosaic) kernels.

Entry points: `api.native_hybrid_attention` (differentiable; packed documents as
`api.Documents`, a state to continue as `api.State`, the final slots) and `api.unsupported` /
`api.is_supported` (for `implementation=` dispatch in `hybrid_jax.ops.nha` and
`hybrid_jax.ops.gsa`).
"""
