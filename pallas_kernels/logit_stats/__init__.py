"""The loss's per-row statistics of float32 logits in one pass (GPU, Pallas Triton lowering)."""
