"""Pallas kernels, one folder per op. Imports jax only (never hybrid_jax), so the kernels can be
tested and benchmarked on their own; `hybrid_jax.ops` dispatches to them."""
