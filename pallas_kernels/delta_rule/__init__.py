"""The gated delta rule (Gated DeltaNet) in Pallas, GPU (Triton lowering) and TPU (Mosaic,
`tpu.py`; tested in TPU interpret mode and by lowering only): entry point
`api.gated_delta_rule` (differentiable: values, final state, gradients of every input and of
the initial state), `api.unsupported` for `implementation=` dispatch in
`hybrid_jax.ops.delta_rule`."""
