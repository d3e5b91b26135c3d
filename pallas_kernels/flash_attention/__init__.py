"""Flash attention with document boundaries (segment ids), causal and sliding-window, GQA, in
Pallas: on GPUs our kernels, entry point `api.flash_attention` (differentiable), `api.unsupported`
for dispatch; on TPUs JAX's splash attention kernels, `splash.splash_attention` and
`splash.unsupported`."""
