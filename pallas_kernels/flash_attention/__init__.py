"""Flash attention with document boundaries (segment ids), causal and sliding-window, GQA, in
Pallas: entry point `api.flash_attention` (differentiable), `api.unsupported` for dispatch."""
