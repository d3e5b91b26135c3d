"""Mamba-2's state-space duality (SSD) recurrence in Pallas (GPU: Triton lowering, `gpu.py`;
TPU: Mosaic, `tpu.py`): packed documents, initial / final state, B/C groups. Entry points:
`api.ssd` (differentiable) and `api.unsupported` (for `implementation=` dispatch in
`hybrid_jax.ops.ssd`)."""
