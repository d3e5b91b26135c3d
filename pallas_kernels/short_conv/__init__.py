"""The short causal depthwise convolution (GDN's q/k/v, Mamba's x/B/C convs) with document
boundaries, SiLU and bias, in Pallas for GPUs: entry point `api.short_conv` (differentiable),
`api.unsupported` for dispatch."""
