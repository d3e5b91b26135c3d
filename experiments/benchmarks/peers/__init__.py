"""Reference implementations in other frameworks, run beside our benchmarks (not imported by
the library; torch is no dependency of hybrid_jax)."""
