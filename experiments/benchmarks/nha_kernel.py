"""NHA Pallas kernel against cuDNN sliding-window / causal attention and the XLA chunked NHA.

    python -m experiments.benchmarks.nha_kernel [--parts check,table,variants,lowering]
        [--lengths 2048,8192,32768] [--windows 64,512,2048] [--out nha_kernel.json]

Shapes B4 T H16 K=V=D=128 M=64, bf16 (the issue's table). Parts:
  check     bf16 kernel vs a float32 reference (values and gradients of every input, rel. error)
  table     fwd and fwd+bwd ms, TFLOP/s and temp memory of every implementation per (T, w)
  variants  the kernel under other tile / warp settings at one shape (tuning)
  lowering  JAX's own Pallas flash attention, Triton vs Mosaic GPU lowering, next to cuDNN
            (the evidence for the lowering choice, NOTES.md)

FLOPs count only useful work (in-window pairs and slot work): window 4·D per (query, key in
window) per head; slots 4·K·M per query head (logits + readout) plus 4·K·M per kv head and token
(state updates); fwd+bwd = 3.5 × fwd (the flash-attention convention).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from experiments.benchmarks.timing import (
    cudnn_op,
    device_name,
    forward_and_backward,
    measure,
    print_table,
    time_compiled,
    write_json,
)
from pallas_kernels.nha import api
from pallas_kernels.nha.block_sizes import BlockSizes
from pallas_kernels.nha.reference import nha_reference

BATCH, HEADS, DIM, SLOTS = 4, 16, 128, 64
NAMES = ("q", "k", "v", "s", "g", "q_window", "k_window")


def make_inputs(batch, length, heads, kv_heads, key, dtype=jnp.bfloat16):
    keys = iter(jax.random.split(key, 8))
    normal = lambda h, d: jax.random.normal(next(keys), (batch, length, h, d), jnp.float32)
    g = jax.nn.log_sigmoid(normal(kv_heads, SLOTS)) / 8
    x = dict(q=normal(heads, DIM), k=normal(kv_heads, DIM), v=normal(kv_heads, DIM),
             s=1 - jnp.exp(g), g=g, q_window=normal(heads, DIM), k_window=normal(kv_heads, DIM))
    return {n: a.astype(dtype) for n, a in x.items()}


def pallas_op(window, blocks=None):
    return lambda q, k, v, s, g, qw, kw: api.native_hybrid_attention(
        q, k, v, s, g, window=window, q_window=qw, k_window=kw, block_sizes=blocks)


def xla_op(window):
    def op(q, k, v, s, g, qw, kw):
        from hybrid_jax.ops.nha import native_hybrid_attention  # the op (issue 5)

        return native_hybrid_attention(q, k, v, s, g, window=window, q_window=qw, k_window=kw,
                                       implementation="xla")

    return op


def window_pairs(length, window):
    window = min(window, length)
    return window * (window + 1) // 2 + (length - window) * window


def nha_flops(length, window):
    attention = 4 * DIM * window_pairs(length, window) * BATCH * HEADS
    slots = 8 * DIM * SLOTS * length * BATCH * HEADS if window < length else 0
    return attention + slots


def _reference_op(q, k, v, s, g, qw, kw, *, window):
    return nha_reference(q, k, v, s, g, window=window, q_window=qw, k_window=kw)


def _value_and_grads(op, x, weights):
    apply = lambda x: op(*(x[n] for n in NAMES))
    loss = lambda x: jnp.sum(apply(x).astype(jnp.float32) * weights)
    return jax.jit(apply)(x), jax.jit(jax.grad(loss))(x)


def part_check(args):
    """bf16 kernel (tiles of --blocks) against the float32 per-token reference on upcast
    inputs."""
    rows = []
    for length, heads, kv_heads, window in ((1000, 4, 2, 200), (777, 2, 2, 0)):
        x = make_inputs(1, length, heads, kv_heads, jax.random.key(1))
        x32 = {n: a.astype(jnp.float32) for n, a in x.items()}
        weights = jax.random.normal(jax.random.key(2), (1, length, heads, DIM), jnp.float32)

        reference = functools.partial(_reference_op, window=window)
        ref_out, ref_grads = _value_and_grads(reference, x32, weights)
        out, grads = _value_and_grads(pallas_op(window, VARIANTS[args.blocks]), x, weights)
        rel = lambda a, b: float(jnp.linalg.norm((a.astype(jnp.float32) - b).ravel())
                                 / jnp.maximum(jnp.linalg.norm(b.ravel()), 1e-30))
        row = {"T": length, "H": heads, "G": kv_heads, "w": window, "out": rel(out, ref_out)}
        row.update({f"d{n}": rel(grads[n], ref_grads[n]) for n in NAMES})
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["T", "H", "G", "w", "out", *(f"d{n}" for n in NAMES)])
    return rows


def part_table(args):
    rows = []
    for length in args.lengths:
        x = make_inputs(BATCH, length, HEADS, HEADS, jax.random.key(0))
        nha_inputs = [x[n] for n in NAMES]
        attention_inputs = (x["q_window"], x["k_window"], x["v"])
        if "cudnn_causal" in args.impls:
            causal = {"impl": "cudnn_causal", "T": length, "w": length,
                      **measure(cudnn_op(None), attention_inputs,
                                4 * DIM * window_pairs(length, length) * BATCH * HEADS)}
            rows.append(causal)
            print(causal, flush=True)
        for window in args.windows:
            impls = {"pallas_nha": (pallas_op(window, VARIANTS[args.blocks]), nha_inputs,
                                    nha_flops(length, window)),
                     "cudnn_swa": (cudnn_op(window), attention_inputs,
                                   4 * DIM * window_pairs(length, window) * BATCH * HEADS)}
            if length <= args.xla_max_length and window in args.xla_windows:
                impls["xla_nha"] = (xla_op(window), nha_inputs, nha_flops(length, window))
            for name, (fn, inputs, flops) in impls.items():
                if name not in args.impls:
                    continue
                row = {"impl": name, "T": length, "w": window, **measure(fn, inputs, flops)}
                rows.append(row)
                print(row, flush=True)
    print_table(rows, ["impl", "T", "w", "fwd_ms", "fwd_bwd_ms", "fwd_TFLOPs", "fwd_bwd_TFLOPs",
                       "temp_MiB", "error"])
    return rows


# Tile variants for --blocks, --variants and --profile-variants: each differs from the current
# defaults only in the fields shown (so "v3" is v3's chunk-state pass with today's other tiles).
VARIANTS = {
    "default": BlockSizes(),
    "q128": BlockSizes(block_q=128, num_warps=8),  # the window blocks up to run 8
    "q64_k128": BlockSizes(block_k=128),
    "q64_w8": BlockSizes(num_warps=8),
    "q64_s2": BlockSizes(num_stages=2),
    "bwd_w8": BlockSizes(backward_num_warps=8, block_q_dkv=64, block_k_dkv=128),
    "bwd_w8_only": BlockSizes(backward_num_warps=8),
    "bwd_s3": BlockSizes(backward_num_stages=3),
    "dkv_k128": BlockSizes(block_k_dkv=128),
    "slot_w8": BlockSizes(slot_num_warps=8),
    "slot_bwd_w4": BlockSizes(slot_backward_num_warps=4),
    "chunk128": BlockSizes(chunk=128, slot_num_warps=8),
    "slots_bf16": BlockSizes(slot_precision="input"),
    "float32": BlockSizes(slot_precision="float32"),  # the default up to run 11
    "v3": BlockSizes(state_group=1, state_block=32),  # one chunk step per scan iteration
    "v4": BlockSizes(state_group=1),
    "scan8": BlockSizes(state_group=8),
    "scan32": BlockSizes(state_group=32),
}


def part_variants(args):
    rows = []
    length, window = args.lengths[0], args.windows[0]
    x = make_inputs(BATCH, length, HEADS, HEADS, jax.random.key(0))
    for name in args.variants:
        blocks = VARIANTS[name]
        row = {"variant": name, "T": length, "w": window,
               **measure(pallas_op(window, blocks), [x[n] for n in NAMES],
                         nha_flops(length, window), memory=False),
               "blocks": str(dataclasses.astuple(blocks))}
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["variant", "T", "w", "fwd_ms", "fwd_bwd_ms", "fwd_TFLOPs", "error"])
    return rows


def part_lowering(args):
    """JAX's Pallas flash attention: Triton lowering (ops/gpu/attention.py) vs Mosaic GPU
    (ops/gpu/attention_mgpu.py), causal, B4 T8192 H16 D128 float16, next to cuDNN."""
    from jax.experimental.pallas.ops.gpu import attention, attention_mgpu

    length = 8192
    keys = jax.random.split(jax.random.key(3), 3)
    # float16: attention_mgpu's example dtype (it rejected bf16 in our first run)
    q, k, v = (jax.random.normal(key, (BATCH, length, HEADS, DIM), jnp.float16) for key in keys)
    flops = 4 * DIM * window_pairs(length, length) * BATCH * HEADS
    mgpu_config = attention_mgpu.TuningConfig(block_q=128, block_kv=128, max_concurrent_steps=2,
                                              causal=True, block_q_dkv=64, block_kv_dkv=64,
                                              block_q_dq=64, block_kv_dq=64)
    impls = {
        "cudnn": cudnn_op(None),
        "pallas_triton": functools.partial(attention.mha, segment_ids=None, causal=True,
                                           sm_scale=DIM**-0.5),
        "pallas_mosaic_gpu": functools.partial(attention_mgpu.attention, config=mgpu_config),
    }
    rows = []
    for name, fn in impls.items():
        row = {"impl": name, "T": length, **measure(fn, (q, k, v), flops)}
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["impl", "T", "fwd_ms", "fwd_bwd_ms", "fwd_TFLOPs", "fwd_bwd_TFLOPs",
                       "error"])
    return rows


def part_profile(args):
    """Each kernel of the pipeline timed alone (T, w: the first of --lengths, --windows), per
    tile variant of --profile-variants (`name` or `name:stage+stage`: only the stages whose
    names contain one of those, the other stages' outputs taken from the first variant): where
    the time goes. Each stage's function is jitted once, run to make the next stages' inputs,
    then timed; compile seconds are reported too."""
    from pallas_kernels.nha import gpu

    length, window = args.lengths[0], args.windows[0]
    x = make_inputs(BATCH, length, HEADS, HEADS, jax.random.key(0))
    delay = lambda a: jnp.pad(a, [(0, 0), (window, 0), (0, 0), (0, 0)])[:, :length]
    q, qw, kw, v = x["q"], x["q_window"], x["k_window"], x["v"]
    ks, vs, ss, gs = (delay(x[n]) for n in ("k", "v", "s", "g"))
    do = jax.random.normal(jax.random.key(5), q.shape, jnp.bfloat16)
    whole = lambda *a, st: pallas_op(window, st.blocks)(*a)
    rows, first_outputs = [], {}
    for spec in args.profile_variants:
        variant, _, wanted = spec.partition(":")
        wanted = wanted.split("+") if wanted else []
        st = gpu.Static(window=window, scale=DIM**-0.5, slots=True, mask_empty=True, group=1,
                        blocks=VARIANTS[variant], interpret=False)

        def stage(name, fn, *inputs, st=st, variant=variant, wanted=wanted):
            """Runs the jitted stage (its outputs feed later stages) and times it."""
            if wanted and not any(part in name for part in wanted):
                return first_outputs.get(name)
            fn = jax.jit(functools.partial(fn, st=st))
            row = {"variant": variant, "stage": name, "T": length, "w": window}
            begin = time.perf_counter()
            try:
                out = jax.block_until_ready(fn(*inputs))
                row["compile_s"] = time.perf_counter() - begin
                row["ms"] = time_compiled(fn, *inputs)
                first_outputs.setdefault(name, out)
            except Exception as e:  # report and go on with the first variant's outputs
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                out = first_outputs.get(name)
            rows.append(row)
            print(row, flush=True)
            return out

        inputs = [x[n] for n in NAMES]
        stage("forward (api, whole)", whole, *inputs)
        stage("fwd+bwd (api, whole)", lambda *a, st: forward_and_backward(
            functools.partial(whole, st=st), len(NAMES))[1](*a), *inputs)
        gc, k_writes, v_writes, log_decay = stage("chunk_prepare", gpu.chunk_prepare,
                                                  ks, vs, ss, gs)
        kst, vst = stage("chunk_scan K, V", lambda k, v, a, st: gpu.chunk_scan(
            (k, v), a, st, reverse=False), k_writes, v_writes, log_decay)
        logits = stage("slot_logits", gpu.slot_logits, q, ks, ss, gc, kst)
        o_w, lse = stage("window_attention", gpu.window_attention, qw, kw, v, logits)
        o = stage("slot_readout_add", gpu.slot_readout_add, o_w, logits, lse, vs, ss, gc, vst)
        delta = jnp.sum(o * do.astype(jnp.float32), axis=-1).transpose(0, 2, 1)
        stage("bwd: window dq", gpu.window_backward_queries, qw, kw, v, do, lse, delta)
        stage("bwd: window dk dv", gpu.backward_window_keys, qw, kw, v, do, lse, delta)
        slot_inputs = (ks, vs, ss, gc, kst, vst)
        dq, da, p, qg = stage("bwd: slot queries",
                              lambda *a, st: gpu.slot_backward_queries(*a[:5], a[5:], st),
                              q, logits, lse, delta, do, *slot_inputs)
        k_pull, v_pull = stage("bwd: chunk deltas reverse", gpu.chunk_deltas_reverse,
                               q, da, do, p, gc)
        k_end, vt_end = stage("bwd: chunk_scan reverse K, V", lambda k, v, a, st: gpu.chunk_scan(
            (k, v), a, st, reverse=True), k_pull, v_pull, log_decay)
        stage("bwd: slot inputs",
              lambda *a, st: gpu.backward_slot_inputs(a[0], a[1], a[2:5], a[5:11], a[11], a[12],
                                                       st),
              q, do, da, p, qg, *slot_inputs, k_end, vt_end)
        write_json(args.out, "nha_kernel_profile", rows)
    print_table(rows, ["variant", "stage", "T", "w", "ms", "compile_s", "error"])
    return rows


PARTS = {"check": part_check, "table": part_table, "variants": part_variants,
         "lowering": part_lowering, "profile": part_profile}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ints = lambda s: [int(x) for x in s.split(",")]
    parser.add_argument("--parts", default="check,table")
    parser.add_argument("--lengths", type=ints, default=[2048, 8192, 32768])
    parser.add_argument("--windows", type=ints, default=[64, 512, 2048])
    parser.add_argument("--xla-max-length", type=int, default=8192,
                        help="longest T for the XLA chunked NHA (slow, memory-hungry)")
    parser.add_argument("--xla-windows", type=ints, default=[512])
    parser.add_argument("--impls", type=lambda s: s.split(","),
                        default=["cudnn_causal", "pallas_nha", "cudnn_swa", "xla_nha"])
    parser.add_argument("--blocks", default="default", help="tile variant of the table rows")
    parser.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS))
    parser.add_argument("--profile-variants", type=lambda s: s.split(","), default=["default"])
    parser.add_argument("--out", default="nha_kernel.json")
    args = parser.parse_args()
    print(device_name(), flush=True)
    results = {}
    for part in args.parts.split(","):
        results[part] = PARTS[part](args)
        write_json(args.out, "nha_kernel", [], parts=results,
                   shape=dict(B=BATCH, H=HEADS, K=DIM, V=DIM, D=DIM, M=SLOTS, dtype="bfloat16"))


if __name__ == "__main__":
    main()
