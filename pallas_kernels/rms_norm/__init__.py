"""RMSNorm and the SiLU-gated RMSNorm over groups of channels, in Pallas for GPUs: entry point
`api.rms_norm` (differentiable), `api.unsupported` for dispatch."""
