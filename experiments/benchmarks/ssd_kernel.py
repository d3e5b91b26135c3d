"""The SSD kernel's parts of `linear_ops.py`: the GPU accuracy check and the tile sweep.

  check  bf16 inputs through `hybrid_jax.ops.ssd(implementation="pallas")` against the per-token
         reference on the same values in float32 (highest matmul precision): relative error of
         y, the final state and the gradients of every input, with documents, initial states,
         odd lengths, G < H and head / state dims 64 / 128 / 256 (and mamba2-340m's heads:
         P 64, N 128, one group), Mamba-2's skip D in every case (y's cotangent
         bf16-representable, so dD = Σ dy·x compares like with like); passes below 1e-2.
         `changes` (linear_ops `--check-changes`) replaces fields of every case's default
         tiles: an option's check before it is a default.
  sweep  each kernel alone under its tile / warp / stage variants at one shape (4 × 8192, H16,
         P = N = 128, one B/C group, bf16: the table's), then the whole op, fwd and fwd+bwd,
         with the best of each next to the defaults; prints the best `BlockSizes`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.timing import (
    changed_defaults,
    error_text,
    measure,
    print_table,
    relative_error,
    time_compiled,
)
from hybrid_jax.ops.ssd import ssd
from pallas_kernels.ssd import api, gpu
from pallas_kernels.ssd.block_sizes import BlockSizes, default_block_sizes

CHECKS = (  # batch, length, heads, groups, P, N, documents
    (2, 1000, 4, 2, 128, 128, True),
    (1, 515, 4, 1, 64, 256, False),
    (1, 333, 2, 2, 256, 64, True),
    (2, 1000, 4, 1, 64, 128, True),  # mamba2-340m's heads (H/G 32 there)
)
GRAD_NAMES = ("x", "dt", "A", "B", "C", "initial_state", "D")


def _check_inputs(batch, length, heads, groups, P, N, documents, seed=0):
    keys = iter(jax.random.split(jax.random.key(seed), 9))
    normal = lambda *shape: jax.random.normal(next(keys), shape, jnp.float32)
    bf16 = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)  # bf16-representable values
    inputs = dict(x=bf16(normal(batch, length, heads, P)),
                  dt=bf16(jax.nn.softplus(normal(batch, length, heads) - 1.0)),
                  A=-jnp.exp(jax.random.uniform(next(keys), (heads,), minval=-1.0, maxval=1.0)),
                  B=bf16(normal(batch, length, groups, N) / np.sqrt(N)),
                  C=bf16(normal(batch, length, groups, N) / np.sqrt(N)),
                  initial_state=normal(batch, heads, P, N),
                  # its own key: the other inputs stay the draws of the checks before D
                  D=jax.random.normal(jax.random.key(seed + 1), (heads,), jnp.float32))
    ids = None
    if documents:  # a start with probability 1/150 per token: mean document ~150 tokens
        starts = jax.random.uniform(next(keys), (batch, length)) < 1 / 150
        ids = jnp.cumsum(starts, axis=1, dtype=jnp.int32)
    weights = (bf16(normal(batch, length, heads, P)), normal(batch, heads, P, N))
    return inputs, ids, weights


def _values_and_grads(impl: str, inputs, ids, weights, dtype):
    def fn(x, dt, A, B, C, initial_state, D):
        return ssd(x.astype(dtype), dt.astype(dtype), A, B.astype(dtype), C.astype(dtype),
                   initial_state=initial_state, segment_ids=ids, return_final_state=True, D=D,
                   implementation=impl)

    @jax.jit
    def run(inputs):
        out, vjp = jax.vjp(fn, *(inputs[n] for n in GRAD_NAMES))
        return out, vjp(tuple(w.astype(o.dtype) for w, o in zip(weights, out, strict=True)))

    return run(inputs)


def part_check(changes: dict | None = None) -> list[dict]:
    with changed_defaults(api, changes or {}):
        return _check_rows([])


def _check_rows(rows: list[dict]) -> list[dict]:
    for batch, length, heads, groups, P, N, documents in CHECKS:
        row = {"B": batch, "T": length, "H": heads, "G": groups, "P": P, "N": N,
               "docs": documents, "pass": False}
        inputs, ids, weights = _check_inputs(batch, length, heads, groups, P, N, documents)
        try:
            (y, final), grads = _values_and_grads("pallas", inputs, ids, weights, jnp.bfloat16)
        except Exception as e:  # noqa: BLE001  (e.g. a kernel that does not compile: report)
            row["error"] = error_text(e)
            rows.append(row)
            print(row, flush=True)
            continue
        with jax.default_matmul_precision("highest"):
            (y_ref, final_ref), grads_ref = _values_and_grads("reference", inputs, ids, weights,
                                                              jnp.float32)
        row.update(y=relative_error(y, y_ref), final=relative_error(final, final_ref))
        row.update({f"d{n}": relative_error(g, r) for n, g, r in zip(GRAD_NAMES, grads, grads_ref,
                                                         strict=True)})
        errors = [row["y"], row["final"], *(row[f"d{n}"] for n in GRAD_NAMES)]
        row["pass"] = bool(max(errors) < 1e-2)
        rows.append(row)
        print(row, flush=True)
    print_table(rows, ["B", "T", "H", "G", "P", "N", "docs", "y", "final",
                       *(f"d{n}" for n in GRAD_NAMES), "pass", "error"])
    print("check:", "PASS" if all(r["pass"] for r in rows) else "FAIL", "(every error < 1e-2)")
    return rows


# --- sweep ------------------------------------------------------------------------------------


class _Padded(NamedTuple):
    """The kernels' own inputs at one shape (random; no documents)."""

    x: jax.Array
    dt: jax.Array
    a: jax.Array
    B: jax.Array
    C: jax.Array
    s0: jax.Array

    @classmethod
    def make(cls, x, dt, A, B, C):
        dt32 = dt.astype(jnp.float32).transpose(0, 2, 1)
        return cls(x, dt32, dt32 * A[:, None], B.astype(x.dtype), C.astype(x.dtype),
                   jnp.zeros((x.shape[0], x.shape[2], x.shape[3], B.shape[3]), jnp.float32))


def _static(blocks: BlockSizes, inputs: _Padded) -> gpu.Static:
    return gpu.Static(blocks=blocks.for_dims(inputs.x.shape[3]),
                      group=inputs.x.shape[2] // inputs.B.shape[2],
                      documents=False, interpret=False)


def _kernel_ms(kernel: str, blocks: BlockSizes, inputs: _Padded) -> float:
    st = _static(blocks, inputs)
    p = inputs
    if kernel == "forward":
        fn = jax.jit(lambda p: gpu.forward(p.x, p.dt, p.a, p.B, p.C, None, p.s0, st,
                                           store_states=False))
        return time_compiled(fn, p)
    batch, length, heads, P = p.x.shape
    states = jnp.ones((batch, heads, length // blocks.chunk, P, p.B.shape[3]), p.x.dtype)
    if kernel == "state_grads":
        fn = jax.jit(lambda p, dy, s: gpu.state_grads(dy, p.a, p.C, None, s, p.s0, st))
        return time_compiled(fn, p, p.x, states)
    kept = jnp.ones((batch, heads, length // blocks.chunk), jnp.float32)
    fn = jax.jit(lambda p, dy, s, ds, k: gpu.chunk_grads(p.x, p.dt, p.a, p.B, p.C, None, dy, s,
                                                         ds, k, st))
    return time_compiled(fn, p, p.x, states, states, kept)


def _variants(kernel: str, base: BlockSizes):
    """Each kernel's variants, likelier winners first (a cut-off sweep keeps those)."""
    if kernel == "forward":
        for stages in (2, 1):
            for block_p in (64, 32, 128):
                for warps in (4, 8):
                    for chunk in (64, 128):
                        yield dataclasses.replace(base, chunk=chunk, block_p=block_p,
                                                  num_warps=warps, num_stages=stages)
    elif kernel == "state_grads":
        for stages in (2, 1):
            for block_p in (64, 32, 128):
                for warps in (4, 8):
                    yield dataclasses.replace(base, backward_block_p=block_p,
                                              backward_num_warps=warps,
                                              backward_num_stages=stages)
    else:
        for block_p in (128, 64):
            for warps in (8, 4):
                for stages in (2, 1):
                    yield dataclasses.replace(base, grads_block_p=block_p,
                                              grads_num_warps=warps, grads_num_stages=stages)


_FIELDS = {"forward": ("chunk", "block_p", "num_warps", "num_stages"),
           "state_grads": ("chunk", "backward_block_p", "backward_num_warps",
                           "backward_num_stages"),
           "chunk_grads": ("chunk", "grads_block_p", "grads_num_warps", "grads_num_stages")}


def part_sweep(ssd_inputs: tuple, deadline: float) -> tuple[list[dict], BlockSizes | None]:
    """Each kernel's variants (coordinate search: the forward first, whose chunk the backward
    kernels then keep; each kernel gets its share of the time to `deadline`), then the whole
    op with the winners and with the defaults. Returns the rows and the winners (None when
    they are the defaults)."""
    padded = _Padded.make(*ssd_inputs)
    P, N = padded.x.shape[3], padded.B.shape[3]
    best = default = default_block_sizes(P, N)
    rows = []
    start = time.perf_counter()
    for kernel, share in (("forward", 0.45), ("state_grads", 0.7), ("chunk_grads", 0.9)):
        timed = []
        kernel_deadline = start + share * (deadline - start)  # the rest: the whole op
        for blocks in _variants(kernel, best):
            if time.perf_counter() > kernel_deadline:
                print(f"sweep: time limit, {kernel} stopped after {len(timed)} variants")
                break
            row = {"kernel": kernel, **{f: getattr(blocks, f) for f in _FIELDS[kernel]}}
            try:
                row["ms"] = _kernel_ms(kernel, blocks, padded)
                timed.append((row["ms"], blocks))
            except Exception as e:  # noqa: BLE001  (a variant that does not compile)
                row["error"] = error_text(e, 100)
            rows.append(row)
            print(row, flush=True)
        if timed:
            best = min(timed, key=lambda t: t[0])[1]
    print_table(rows, ["kernel", "chunk", "block_p", "backward_block_p", "grads_block_p",
                       "num_warps", "num_stages", "backward_num_warps", "backward_num_stages",
                       "grads_num_warps", "grads_num_stages", "ms", "error"])
    whole = _whole_op_rows(ssd_inputs, {"default": default, "best": best}, deadline)
    rows += whole
    print(f"sweep best: {best}")
    return rows, (best if best != default else None)


def _output(x, dt, A, B, C, *, blocks):
    return api.ssd(x, dt, A, B, C, block_sizes=blocks)[0]


def _whole_op_rows(ssd_inputs, named: dict[str, BlockSizes], deadline) -> list[dict]:
    rows = []
    for name, blocks in named.items():
        if time.perf_counter() > deadline or (name != "default" and blocks == named["default"]):
            continue
        op = functools.partial(_output, blocks=blocks)
        row = {"kernel": f"whole op ({name})", **measure(op, ssd_inputs, memory=False)}
        rows.append(row)
        print(row, flush=True)
    return rows
