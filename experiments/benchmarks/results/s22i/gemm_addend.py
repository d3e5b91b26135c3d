"""Session 22, call i: does XLA (GPU) fold `dot + dot` into one gemm with an addend (cuBLAS
beta = 1), as the backward's dx of several projections of one input needs? Prints, per form,
the optimized HLO's gemm custom calls (their operand counts) and the leftover add fusions, and
times each form (bf16, [32768, 2048] x [2048, 1024] per term, as mamba2-340m's dx)."""
import re
import time

import jax
import jax.numpy as jnp

M, K, N = 32768, 2048, 1024
keys = iter(jax.random.split(jax.random.key(0), 16))
bf = lambda *s: jax.random.normal(next(keys), s, jnp.float32).astype(jnp.bfloat16)
a = [bf(M, K) for _ in range(4)]
b = [bf(K, N) for _ in range(4)]
x = bf(M, N)


def sum_of_dots(n):
    def f(a, b):
        out = a[0] @ b[0]
        for i in range(1, n):
            out = out + a[i] @ b[i]
        return out
    return f


def f32_sum(n):  # accumulate in float32, round once
    def f(a, b):
        out = jnp.dot(a[0], b[0], preferred_element_type=jnp.float32)
        for i in range(1, n):
            out = out + jnp.dot(a[i], b[i], preferred_element_type=jnp.float32)
        return out.astype(jnp.bfloat16)
    return f


def backward_dx(n):  # autodiff of n projections of one input
    def f(a, b):
        w = [bi.T for bi in b[:n]]
        loss = lambda x: sum(jnp.vdot((x @ wi).astype(jnp.float32), ai.astype(jnp.float32))
                             for wi, ai in zip(w, a[:n], strict=True))
        return jax.grad(loss)(x)
    return f


forms = {f"{name} n={n}": make(n) for n in (2, 4)
         for name, make in (("dot+dot", sum_of_dots), ("f32 sum", f32_sum),
                            ("autodiff dx", backward_dx))}
for name, fn in forms.items():
    compiled = jax.jit(fn).lower(a, b).compile()
    text = compiled.as_text()
    gemms = re.findall(r"custom-call\(([^)]*)\), custom_call_target=\"(__cublas[^\"]*)\"", text)
    adds = len(re.findall(r"fusion[^ ]* = bf16\[32768,1024\].*kind=kLoop", text))
    out = compiled(a, b)
    out.block_until_ready()
    start = time.perf_counter()
    for _ in range(20):
        out = compiled(a, b)
    out.block_until_ready()
    ms = (time.perf_counter() - start) / 20 * 1e3
    print(f"{name:16s} {ms:7.3f} ms  gemms (operands): "
          f"{[len(g[0].split(',')) for g in gemms]}  bf16 [M,N] loop fusions: {adds}",
          flush=True)
