r"""Linear-recurrence ops, every rung of ours, against flash-linear-attention (fla) and cuDNN
causal attention, fwd and fwd+bwd, in one run.

    python -m experiments.benchmarks.linear_ops [--parts check,sweep,table]
        [--check-changes 'grads_summed_scores=True']
        [--shapes 4x8192,8x4096,2x16384] [--ops ssd,gated_delta_rule,gated_slot_attention]
        [--impls xla,pallas] [--variants 'LABEL;LABEL' | all | none] [--no-fla]
        [--fla-timeout SECONDS] [--fla-runs N] [--fla-cache DIR [--fla-warm N]]
        [--time-limit SECONDS]
        [--out linear_ops.json]

Shapes (`mixer_shapes`): `BxT` is H16, K = V = P = N = 128 (SSD: one B/C group; GSA: 64
slots); `BxTxHxK[xV]` gives heads and dims (`4x8192x3x256x512`); `MODEL@BxT` each op at the
shape of the preset's layers (`gdn-340m@4x8192`: the gated delta rule at H3 K256 V512; ops the
model does not run are skipped). SSD reads K as its state size N and V as its head dim P.
bf16 inputs. Parts:
  check  the SSD kernel's GPU accuracy (`ssd_kernel.part_check`; `--check-changes` checks
         an option: these BlockSizes fields changed in every case's defaults)
  sweep  the SSD kernel's tiles at 4 × 8192 (`ssd_kernel.part_sweep`); the table then adds a
         row of the sweep's best
  table  per shape and op: every rung the op has (enumerated through `implementation=`, so a
         new rung appears by itself; "reference" left out; `--impls` keeps some), the SSD
         and GDN kernels' variants (`SSD_VARIANTS`; `gdn_variants(shape)`, built from the
         shape's own default tiles; `--variants` keeps some by label), fla's chunk kernel (the
         peer script `peers/fla_linear.py`, run in its own process BEFORE JAX takes the GPU)
         and cuDNN causal attention (`jax.nn.dot_product_attention`) at the op's [B, T, H, K]
         (K for its v too where V != K); the ratios ours/fla (fwd, fwd+bwd) and ours/cuDNN
         (fwd+bwd) pair rows of one shape (B, T, H, K, V, and G / M); then the issue's
         targets (at 4x8192).
The fla peer measures the same `--shapes` and `--ops`, in that order, and each of its rows
is kept as it arrives (`peers/stream.py`): at `--fla-timeout` (default: ~90 s per op for the
first shape, fla's autotuning, and 25 s for each further one, within `--time-limit`) it is
stopped and what it finished is used; it runs `--fla-runs` times (default 2) and its fastest
times are compared (fla's forward moved 0.80-1.09 ms between processes on the H200). Every
row is printed (flushed) when measured and the JSON rewritten, so a run stopped from outside
keeps its rows too. Rows past `--time-limit` (seconds for the whole run, the peer included)
are skipped (marked so).

gdn-340m's mixer (B4 T8192 H3 K256 V512, two 256-column V slices): our default, the K 256
variants (fused outputs against split, V tiles 16 / 32, gradient warps 4 / 8), fla and cuDNN at
H3 K256, ≤ 150 s on an H200 (fla's peer up to 75 s of it: its autotuning at a new shape):

    python -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
        --impls pallas --shapes gdn-340m@4x8192 --fla-timeout 75 --time-limit 145 \
        --variants 'fused outputs;fused outputs V32;split outputs V32;gradients 4 warps' \
        --fla-cache /tmp/triton_fla --out linear_gdn340m.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments.benchmarks.mixer_shapes import MixerShape, row_key, shape_jobs
from experiments.benchmarks.peers.autotune_warm import WARM_VARIABLE
from experiments.benchmarks.peers.stream import run_json_lines
from experiments.benchmarks.ssd_kernel import part_check, part_sweep
from experiments.benchmarks.timing import (
    cudnn_op,
    device_name,
    measure,
    parse_changes,
    parse_labels,
    print_table,
    write_json,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import ops
from hybrid_jax.ops.delta_rule import gated_delta_rule
from hybrid_jax.ops.dispatch import IMPLEMENTATIONS
from hybrid_jax.ops.gsa import gated_slot_attention
from hybrid_jax.ops.segments import document_starts
from hybrid_jax.ops.ssd import ssd
from pallas_kernels.delta_rule import api as pallas_gdn
from pallas_kernels.delta_rule.block_sizes import BlockSizes as GDNBlockSizes
from pallas_kernels.delta_rule.block_sizes import default_block_sizes as gdn_block_sizes
from pallas_kernels.nha import api as pallas_nha
from pallas_kernels.nha.block_sizes import default_block_sizes as nha_block_sizes
from pallas_kernels.ssd import api as pallas_ssd
from pallas_kernels.ssd.block_sizes import BlockSizes

OPS = {
    "ssd": functools.partial(ssd, chunk_size=64),
    "gated_delta_rule": functools.partial(gated_delta_rule, chunk_size=64),
    "gated_slot_attention": gated_slot_attention,
}
# The targets at 4 × 8192, H16, K = V = 128 (fwd+bwd unless named): ours ≤ factor ×
# peer time.
TARGET_SHAPE = MixerShape(4, 8192)
TARGETS = {
    "ssd": (("fla", "fwd_ms", 1 / 1.2), ("cudnn", "fwd_bwd_ms", 1.5)),
    "gated_delta_rule": (("fla", "fwd_ms", 1 / 1.2), ("cudnn", "fwd_bwd_ms", 1.5)),
    "gated_slot_attention": (("fla", "fwd_bwd_ms", 1 / 1.2),),
}
# SSD kernel variants timed beside the defaults (the defaults' NOTES say why each is open);
# the default row's sequence segments are automatic (S = 2 at 4 × 8192, 1 at 8 × 4096).
# fla's form (NOTES.md round 5): a state-only serial pass, outputs in parallel
_STATE_PASS = dict(state_pass=True, state_block_n=64, cumulative_decay=True)
# the bf16 default since session 15 (`ssd.default_block_sizes`, P, N <= 128)
_BF16_DEFAULT = dict(_STATE_PASS, num_stages=4, local_num_stages=3, state_vectors_in_step=True)
SSD_VARIANTS = {"grads 2 stages": BlockSizes(grads_num_stages=2),
                "split forward": BlockSizes(split_forward=True),
                "state pass": BlockSizes(**_STATE_PASS),
                "state pass 1 stage": BlockSizes(**_STATE_PASS, local_num_stages=1),
                "state pass 8 warps": BlockSizes(**_STATE_PASS, local_num_warps=8),
                "state pass whole N": BlockSizes(**dict(_STATE_PASS, state_block_n=None)),
                # NOTES.md round 6 (CPU ptxas only): the fused step's exponentials beside C·Bᵀ;
                # cp.async loads a whole step ahead (at 2 stages each step waits for all of
                # them at its top) in the fused loop, the state pass or its output kernel
                "fused kernel": BlockSizes(),
                "decays first": BlockSizes(decays_first=True),
                "fused 3 stages": BlockSizes(num_stages=3),
                "decays first 3 stages": BlockSizes(decays_first=True, num_stages=3),
                **{f"state pass, {name}": BlockSizes(**_STATE_PASS, **stages)
                   for name, stages in (("states 3 stages", dict(num_stages=3)),
                                        ("states 4 stages", dict(num_stages=4)),
                                        ("outputs 3 stages", dict(local_num_stages=3)),
                                        ("both 3 stages", dict(num_stages=3,
                                                               local_num_stages=3)))},
                # NOTES.md round 7 (CPU ptxas only): chunk_states' dt / decays loaded by cp.async
                # stages ahead instead of through registers (waited for within each step);
                # 'vectors in step, states 4 stages' is the bf16 default since session 15
                **{f"state pass, {name}": BlockSizes(**_STATE_PASS, local_num_stages=3, **change)
                   for name, change in (
                       ("states 4 stages, outputs 3", dict(num_stages=4)),
                       ("vectors in step", dict(num_stages=3, state_vectors_in_step=True)),
                       ("vectors in step, states 4 stages",
                        dict(num_stages=4, state_vectors_in_step=True)))},
                **{f"segments {S}": BlockSizes(segments=S) for S in (1, 2, 4)},
                # session 16: chunk_grads (1.33 ms a call at mamba2-340m's H32 P64, a quarter of
                # its train step) loads each head of its loop through registers at 1 stage; at
                # P 64 more stages may fit in shared memory. Today's bf16 forward, grads changed
                **{f"default, grads {name}": BlockSizes(**_BF16_DEFAULT, **change)
                   for name, change in (("2 stages", dict(grads_num_stages=2)),
                                        ("3 stages", dict(grads_num_stages=3)),
                                        ("4 warps", dict(grads_num_warps=4)),
                                        ("4 warps 2 stages", dict(grads_num_warps=4,
                                                                  grads_num_stages=2)))},
                # session 18 (CPU ptxas only): chunk_grads sums its heads' score gradients before
                # the products with B and C; C·Bᵀ and the log decays' chunk sums by XLA. Today's
                # P 64 default (grads 3 stages) with it, and at 2 stages
                **{f"default, grads summed scores{name}": BlockSizes(
                    **_BF16_DEFAULT, grads_summed_scores=True, grads_num_stages=stages)
                   for name, stages in (("", 3), (" 2 stages", 2))},
                # session 19 (CPU ptxas only; P 64 labels: 'default, grads summed scores' is the
                # P 64 default, the control): state_grads' state in [64, 64] tiles (256 programs,
                # two a SM, no spills), at 4 or 8 warps; chunk_grads at 16 warps (128 registers,
                # 4 warps a scheduler instead of 2)
                **{f"default, {name}": BlockSizes(
                    **_BF16_DEFAULT, grads_summed_scores=True, grads_num_stages=3, **change)
                   for name, change in (
                       ("state grads 64 columns", dict(backward_block_n=64)),
                       ("state grads 64 columns 8 warps",
                        dict(backward_block_n=64, backward_num_warps=8)),
                       ("grads 16 warps", dict(grads_num_warps=16)),
                       ("grads 16 warps, state grads 64 columns",
                        dict(grads_num_warps=16, backward_block_n=64)))}}
# Gated delta rule kernel variants (its NOTES.md, Rounds 3 to 10), each a change to the shape's
# training default (`gdn_default_blocks`: the outputs split from the state-only sequential
# pass in V tiles of 32, T inverted block by block, the per-chunk gradients split in two
# kernels at 4 warps). A variant's tiles serve both its forward and its fwd+bwd (the
# default's undifferentiated forward keeps the fused pass at K <= 128).
GDN_VARIANTS = (
    # (the fused pass carries the state whole: `forward_state_key_block` is for the split one)
    ("fused outputs", dict(split_outputs=False, forward_state_key_block=None)),
    ("fused outputs V32", dict(split_outputs=False, forward_state_key_block=None, value_block=32)),
    ("fused outputs V64", dict(split_outputs=False, forward_state_key_block=None, value_block=64)),
    ("whole-tile inverse", dict(inverse_by_block=False)),
    ("split outputs V16", dict(value_block=16)),
    ("split outputs V32", dict(value_block=32)),
    ("split outputs V64", dict(value_block=64)),
    ("sequential 8 warps", dict(state_num_warps=8)),
    ("sequential 4 warps", dict(state_num_warps=4)),
    ("sequential 2 warps", dict(state_num_warps=2)),
    ("sequential 2 warps 3 stages", dict(state_num_warps=2, state_num_stages=3)),
    ("sequential 2 warps V16", dict(state_num_warps=2, value_block=16)),
    ("sequential V64 8 warps", dict(value_block=64, state_num_warps=8)),
    ("outputs 8 warps", dict(outputs_num_warps=8)),
    ("forward V64", dict(forward_value_block=64)),
    ("forward V64 4 stages", dict(forward_value_block=64, forward_state_num_stages=4)),
    ("forward 1 stage", dict(forward_state_num_stages=1)),
    ("forward 4 warps", dict(forward_state_num_warps=4)),
    ("state stored first", dict(store_state_first=True)),
    ("forward V64 4 stages, state first", dict(forward_value_block=64, forward_state_num_stages=4,
                                               store_state_first=True)),
    ("reverse 1 stage", dict(state_num_stages=1, forward_state_num_stages=2)),
    ("reverse small scales 1 stage", dict(reverse_small_scales=True, state_num_stages=1,
                                          forward_state_num_stages=2)),
    ("forward 1 stage 4 warps", dict(forward_state_num_stages=1, forward_state_num_warps=4)),
    ("forward 1 stage, reverse small scales", dict(forward_state_num_stages=1,
                                                   reverse_small_scales=True, state_num_stages=1)),
    ("forward 1 stage 4 warps, reverse small scales", dict(
        forward_state_num_stages=1, forward_state_num_warps=4, reverse_small_scales=True,
        state_num_stages=1)),
    ("forward V64 4 stages, reverse small scales", dict(
        forward_value_block=64, forward_state_num_stages=4, reverse_small_scales=True,
        state_num_stages=1)),
    ("forward V64 2 stages", dict(forward_value_block=64, forward_state_num_stages=2)),
    ("forward V64 key blocks", dict(forward_value_block=64, forward_state_key_block=64)),
    ("forward V64 key blocks 2 stages", dict(forward_value_block=64, forward_state_key_block=64,
                                             forward_state_num_stages=2)),
    ("forward key blocks", dict(forward_state_key_block=64)),
    ("reverse key blocks", dict(reverse_state_key_block=64)),
    ("reverse key blocks 4 warps", dict(reverse_state_key_block=64, state_num_warps=4)),
    # (at 8 warps a 64-row block splits its products over two layouts: ptxas, NOTES.md Round 15)
    ("reverse key blocks 128", dict(reverse_state_key_block=128)),
    ("outputs V128", dict(outputs_value_block=128)),
    ("outputs V64", dict(outputs_value_block=64)),
    # the outputs' Q S₀ over key blocks of 64, cp.async-pipelined (gdn-mem-probe; not timed)
    ("outputs V64 K64 3 stages", dict(outputs_value_block=64, outputs_key_block=64,
                                      outputs_num_stages=3)),
    ("outputs V128 K64 3 stages", dict(outputs_value_block=128, outputs_key_block=64,
                                       outputs_num_stages=3)),
    ("outputs V64 K64 2 stages", dict(outputs_value_block=64, outputs_key_block=64,
                                      outputs_num_stages=2)),
    # K 128 (NOTES.md Round 17, ptxas only): the state pass in fla's order of events (state
    # stores, then the wait for the chunk's loads, then W S), with the outputs pipelined
    ("state first outputs K64", dict(store_state_first=True, outputs_value_block=128,
                                     outputs_key_block=64, outputs_num_stages=3)),
    ("forward key blocks outputs K64", dict(forward_state_key_block=64, outputs_value_block=128,
                                            outputs_key_block=64, outputs_num_stages=3)),
    ("forward key blocks outputs V64 K64", dict(forward_state_key_block=64,
                                                outputs_value_block=64, outputs_key_block=64,
                                                outputs_num_stages=3)),
    # the key gradients' V-tile products in a loop, cp.async-pipelined (Round 17, ptxas only)
    ("key gradients pipelined 2 stages", dict(pipelined_key_gradients=True,
                                              gradient_num_stages=2)),
    ("key gradients pipelined 3 stages", dict(pipelined_key_gradients=True,
                                              gradient_num_stages=3)),
    # the pair gradients' V-tile products in a loop, cp.async-pipelined (Round 21; the
    # training default from K 128 since session 16)
    ("pair gradients pipelined", dict(pipelined_pair_gradients=True)),
    ("prepare TF32 merges", dict(tf32_merges=True)),  # NOTES.md Round 18 (ptxas only)
    # the reverse pass's tiles read where first used, k, P, dO, W a step ahead by cp.async, q
    # through registers (Round 22, ptxas only; small scales: the default from K 128)
    ("reverse in flight", dict(reverse_in_flight=True, reverse_small_scales=True,
                               state_num_stages=2, reverse_state_key_block=128)),
    # the reverse pass as before Round 22 (the default above K 128 until session 16)
    ("reverse not in flight", dict(reverse_in_flight=False, state_num_stages=1,
                                   reverse_state_key_block=None)),
    ("gradients K32", dict(gradient_key_block=32)),
    ("gradients K128", dict(gradient_key_block=128)),
    ("gradients K128 8 warps", dict(gradient_key_block=128, gradient_num_warps=8)),
    ("gradients 4 warps", dict(gradient_num_warps=4)),
    ("gradients 8 warps", dict(gradient_num_warps=8)),
    ("gradients V128", dict(gradient_value_block=128)),
    # `chunk_prepare` reading every input at its top in one batch, not after P's and W's
    # stores (NOTES.md session 19, ptxas only; K <= 128); with the TF32 merges it is the
    # forward alone's default plus the option ('prepare TF32 merges' is the control)
    ("prepare loads first", dict(prepare_loads_first=True, tf32_merges=True)),
    ("prepare loads first, exact merges", dict(prepare_loads_first=True)),
)
# The head dim each tile of a GDN kernel tiles ("value": of one V slice).
GDN_TILES = {"value_block": "value", "gradient_value_block": "value",
             "outputs_value_block": "value", "gradient_key_block": "key"}
# NHA's pallas rung (profiled by op_kernels; linear_ops times no NHA): changes to its GPU
# defaults at the shape's head dim (`pallas_kernels.nha.block_sizes.default_block_sizes`: the
# slot backward split at 4 warps; from D 128 every slot kernel over feature tiles of 64 and
# the window dk/dv kernel key-major; at D 256 also 3 backward stages and 128 query rows).
NHA_VARIANTS = {
    "slot backward split w4": dict(split_slot_backward=True, slot_backward_num_warps=4),
    "slot backward split w4 inputs tiled": dict(split_slot_backward=True,
                                                slot_backward_num_warps=4, slot_input_block=64),
    # (the form before the feature tiles; with them at 8 warps see nha_kernel's variants)
    "slot backward unsplit w8": dict(split_slot_backward=False, slot_backward_num_warps=8,
                                     slot_feature_block=None),
    # the logits, readout, dA / P and dq kernels without the feature tiles of 64 (nha/NOTES.md,
    # session 18; the default from D 128 since session 19): whole-chunk tiles, and at 8
    # warps (D 256's form before session 19)
    "slot features whole": dict(slot_feature_block=None),
    "slot features whole w8": dict(slot_feature_block=None, slot_num_warps=8),
    # the window kernels before session 19 (nha/NOTES.md, session 19: the defaults since):
    # the dk/dv kernel's scores query-major, and at D 256 also 2 backward stages and 64
    # query rows in the forward and dq
    "window keys query-major": dict(window_keys_transposed=False),
    "window tiles before s19": dict(window_keys_transposed=False, backward_num_stages=2,
                                    block_q=64),
    # chunks of 32: a window of 32 (nha-340m's) is then one chunk, so the slot kernels read
    # k, v, s, g in place instead of copies delayed by w (nha/NOTES.md, session 22)
    "chunk 32": dict(chunk=32),
    # chunks of 128 (nha/NOTES.md, session 29: half the bytes of states and deltas), the slot
    # kernels at 8 warps (a 64-row band per warpgroup)
    "chunk 128 w8": dict(chunk=128, slot_num_warps=8, slot_backward_num_warps=8),
}
VARIANT_LABELS = (*SSD_VARIANTS, "sweep best", *(label for label, _ in GDN_VARIANTS),
                  *NHA_VARIANTS)
COLUMNS = ["op", "impl", "B", "T", "H", "K", "V", "fwd_ms", "fwd_bwd_ms", "vs_fla_fwd",
           "vs_fla_fwd_bwd", "vs_cudnn_fwd_bwd", "temp_MiB", "error"]


def make_inputs(name: str, shape: MixerShape, key: jax.Array) -> tuple:
    """bf16 inputs of op `name` ("attention": cuDNN's q, k, v, all at K) at `shape`."""
    keys = iter(jax.random.split(key, 8))
    bf16 = jnp.bfloat16
    batch, length, heads = shape.batch, shape.length, shape.heads

    def normal(*dims, dtype=bf16):
        return jax.random.normal(next(keys), dims, jnp.float32).astype(dtype)

    bthk, bthv = (batch, length, heads, shape.key_dim), (batch, length, heads, shape.value_dim)
    if name == "attention":
        return normal(*bthk), normal(*bthk), normal(*bthk)
    if name == "ssd":  # x [B, T, H, P = V], B and C [B, T, G, N = K]
        dt = jax.nn.softplus(normal(batch, length, heads, dtype=jnp.float32) - 3.0).astype(bf16)
        a = -jnp.exp(jax.random.uniform(next(keys), (heads,), jnp.float32, 0.0, 2.7))
        bc = (batch, length, shape.groups, shape.key_dim)
        return normal(*bthv), dt, a, normal(*bc), normal(*bc)
    if name == "gated_delta_rule":
        q, k = (ops.l2_normalize(normal(*bthk)) for _ in range(2))
        g = -jax.nn.softplus(normal(batch, length, heads, dtype=jnp.float32)).astype(bf16)
        beta = jax.nn.sigmoid(normal(batch, length, heads, dtype=jnp.float32)).astype(bf16)
        return q, k, normal(*bthv), g, beta
    if name == "gated_slot_attention":
        g = jax.nn.log_sigmoid(normal(batch, length, heads, shape.slots, dtype=jnp.float32)) / 8
        s = (1 - jnp.exp(g)).astype(bf16)
        return normal(*bthk), normal(*bthk), normal(*bthv), s, g.astype(bf16)
    raise ValueError(name)


def rungs(name: str, inputs: tuple) -> list[tuple[str, str | None]]:
    """(implementation, None or the reason it refuses this call) for every rung the op has,
    asked through `implementation=` (an unknown name raises 'is not available')."""
    found = []
    for impl in IMPLEMENTATIONS:
        if impl == "reference":  # the per-token definition: not a contender
            continue
        try:
            jax.eval_shape(functools.partial(OPS[name], implementation=impl), *inputs)
            found.append((impl, None))
        except ValueError as e:
            if "is not available" not in str(e):
                found.append((impl, (str(e).splitlines() or [""])[0][:160]))
    return found


def fla_rows(shapes: str, op_names: str, timeout: float, cache: str | None = None,
             warm: int = 0, runs: int = 1) -> list[dict]:
    """The fla peer in a subprocess (torch must take and free the GPU before JAX): its last
    row per (op, shape), each kept as it arrives, also those before a time-out. `cache`: a
    directory for Triton's kernel and autotuning cache (`TRITON_CACHE_DIR` with
    `TRITON_CACHE_AUTOTUNING=1`), so fla's autotuning — minutes on its first calls, 159 s for
    `chunk_gsa`'s forward alone on the H200 — is paid once and reused by later runs given it.
    `warm` > 1 (with `cache`): first that many warm-up workers compile slices of fla's configs
    into the cache in parallel (`peers.fla_linear`, `FLA_PEER_WARM`), within half the time.
    `runs` > 1: the peer runs that many times (within `timeout`) and each row keeps its
    fastest times, every run's in `fwd_ms_runs` / `fwd_bwd_ms_runs` (fla's forward moved
    0.80-1.09 ms between processes on the H200, session 13: the ratio is against its best)."""
    command = [sys.executable, "-m", "experiments.benchmarks.peers.fla_linear", "--shapes",
               shapes, "--ops", op_names]
    env = None if cache is None else {"TRITON_CACHE_DIR": str(Path(cache).resolve()),
                                      "TRITON_CACHE_AUTOTUNING": "1"}
    deadline = time.monotonic() + timeout
    if warm > 1 and env is not None:
        warm_up_fla(command, env, warm, timeout / 2)
    by_run, failure = [], ""
    for _ in range(runs):
        left = deadline - time.monotonic()
        if left <= 1:
            break
        print(f"fla peer: up to {left:.0f} s" + (f", Triton cache {cache}" if cache else ""),
              flush=True)
        lines, failure = run_json_lines(command, left, echo="fla peer:", env=env)
        if failure:
            print("fla peer:", failure, flush=True)
        rows = {row_key(row): row for row in lines if "op" in row}  # the first line: versions
        for row in rows.values():
            if row.pop("partial", False):
                row["error"] = "fwd+bwd not reached: " + (failure or "peer stopped")
        by_run.append(rows)
    merged = {}
    for rows in by_run:
        for key, row in rows.items():
            merged.setdefault(key, []).append(row)
    return ([_fastest(rows, len(by_run) > 1) for rows in merged.values()]
            or [{"op": "*", "impl": "fla", "error": "fla peer failed: " + (failure or "no rows")}])


def _fastest(rows: list[dict], several: bool) -> dict:
    """One (op, shape)'s rows from several peer runs: the first, with each time the fastest."""
    row = dict(rows[0])
    for key in ("fwd_ms", "fwd_bwd_ms"):
        times = [r[key] for r in rows if key in r]
        if times:
            row[key] = min(times)
            if several:
                row[f"{key}_runs"] = times
    if "fwd_bwd_ms" in row and row.get("error", "").startswith("fwd+bwd not reached"):
        del row["error"]
    return row


def warm_up_fla(command: list[str], env: dict[str, str], workers: int, timeout: float) -> None:
    """Runs `workers` fla peers at once, worker i autotuning over its slice of each kernel's
    configs and caching no choice (`FLA_CACHE_RESULTS=0`, `TRITON_CACHE_AUTOTUNING=0`): they
    fill the shared Triton cache with every config's compiled kernel. Killed at `timeout`."""
    start = time.monotonic()
    processes = [subprocess.Popen(
        [*command, "--iters", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env, "TRITON_CACHE_AUTOTUNING": "0", "FLA_CACHE_RESULTS": "0",
             WARM_VARIABLE: f"{i}/{workers}"}) for i in range(workers)]
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(start + timeout - time.monotonic(), 0.0)))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            codes.append("timed out")
    print(f"fla warm-up: {workers} workers in {time.monotonic() - start:.0f} s, exits {codes}",
          flush=True)


def default_fla_timeout(op_names: str, shapes: str) -> float:
    """Seconds for the peer: fla's autotuning on each op's first shape (~a minute on the
    H200), then seconds per further shape; with margin."""
    ops, more = len(op_names.split(",")), len(shapes.split(",")) - 1
    return 90.0 * ops + 25.0 * ops * more


def _ratios(row: dict, fla: dict | None, cudnn: dict | None) -> None:
    pairs = (("vs_fla_fwd", "fwd_ms", fla), ("vs_fla_fwd_bwd", "fwd_bwd_ms", fla),
             ("vs_cudnn_fwd_bwd", "fwd_bwd_ms", cudnn))
    for column, key, peer in pairs:
        if peer and row.get(key) and peer.get(key):
            row[column] = row[key] / peer[key]


def gdn_default_blocks(shape: MixerShape) -> GDNBlockSizes:
    """The tiles the pallas rung runs at `shape` when training: `default_block_sizes(K, V)`
    of each V slice (V > `VALUE_SLICE` runs as slices of it, each with its defaults)."""
    return gdn_block_sizes(shape.key_dim, min(shape.value_dim, pallas_gdn.VALUE_SLICE))


def gdn_variants(shape: MixerShape) -> dict[str, GDNBlockSizes]:
    """label → tiles of each of `GDN_VARIANTS` at `shape`, applied to `gdn_default_blocks`;
    left out: a change the default already has, a tile wider than the head dim it tiles, and
    a variant equal to an earlier one."""
    base = gdn_default_blocks(shape)
    dims = {"key": shape.key_dim, "value": min(shape.value_dim, pallas_gdn.VALUE_SLICE)}
    variants = {}
    for label, changes in GDN_VARIANTS:
        blocks = dataclasses.replace(base, **changes)
        too_wide = any(changes[tile] > dims[GDN_TILES[tile]] for tile in changes
                       if tile in GDN_TILES)
        if not too_wide and blocks != base and blocks not in variants.values():
            variants[label] = blocks
    return variants


def kernel_variants(name: str, shape: MixerShape, tuned=None, only=None,
                    segment_ids=None, window: int = 512) -> dict:
    """"pallas (label)" → fn(*inputs) of each kernel variant of `name`'s pallas rung timed
    beside it at `shape` (`only`: the labels to keep, None for all; `segment_ids` `[B, T]`:
    packed documents): `SSD_VARIANTS` and the sweep's best (`tuned`), `gdn_variants(shape)`,
    `NHA_VARIANTS` (at `window`); none for other ops. SSD's inputs may end in Mamba-2's D."""
    if name == "ssd":
        variants = dict(SSD_VARIANTS, **({"sweep best": tuned} if tuned else {}))
        call = lambda *a, blocks: pallas_ssd.ssd(  # noqa: E731
            *a[:5], D=a[5] if len(a) > 5 else None, segment_ids=segment_ids,
            block_sizes=blocks)[0]
    elif name == "gated_delta_rule":
        variants = gdn_variants(shape)
        starts = document_starts(name, segment_ids, shape.batch, shape.length)
        call = lambda *a, blocks: pallas_gdn.gated_delta_rule(  # noqa: E731
            *a, starts=starts, block_sizes=blocks)[0]
    elif name == "native_hybrid_attention":
        default = nha_block_sizes("gpu", shape.key_dim)
        variants = {label: dataclasses.replace(default, **fields)
                    for label, fields in NHA_VARIANTS.items()}
        documents = (None if segment_ids is None
                     else pallas_nha.documents_from_segment_ids(segment_ids))
        call = lambda *a, blocks: pallas_nha.native_hybrid_attention(  # noqa: E731
            *a, window=window, documents=documents, block_sizes=blocks)
    else:
        return {}
    return {f"pallas ({label})": functools.partial(call, blocks=blocks)
            for label, blocks in variants.items() if only is None or label in only}


def parse_variants(text: str) -> list[str]:
    """`--variants`: all, none or ';'-separated labels of `VARIANT_LABELS`."""
    return parse_labels(text, VARIANT_LABELS)


def _candidates(name: str, shape: MixerShape, inputs: tuple, impls: set[str] | None, tuned,
                variants: list[str] | None) -> list[tuple]:
    """(label, None or why it is not timed, fn) for each rung of `name` kept by `impls`, and
    when its pallas rung runs, that rung's `kernel_variants` kept by `variants`."""
    found = [(impl, reason, functools.partial(OPS[name], implementation=impl))
             for impl, reason in rungs(name, inputs) if impls is None or impl in impls]
    if any(impl == "pallas" and reason is None for impl, reason, _ in found):
        found += [(label, None, fn)
                  for label, fn in kernel_variants(name, shape, tuned, variants).items()]
    return found


def part_table(args, peers: list[dict], tuned, deadline: float, emit) -> list[dict]:
    """The table's rows; `emit(row)` as each is measured (prints it, saves the JSON)."""
    rows = []
    impls = None if args.impls is None else set(args.impls.split(","))
    variants = parse_variants(args.variants)
    fla = {row_key(row): row for row in peers}
    cudnn: dict[tuple, dict] = {}

    def add(row):
        rows.append(row)
        emit(row)

    jobs, skipped = shape_jobs(args.shapes, args.ops.split(","))
    for line in skipped:
        print(line, flush=True)
    for name, shape in jobs:
        fields = shape.fields(name)
        if time.perf_counter() > deadline:
            add({"op": name, "impl": "*", **fields, "error": "skipped: time limit"})
            continue
        attention = {"op": "attention", "impl": "cudnn causal", **shape.fields("attention")}
        if row_key(attention) not in cudnn:  # once per [B, T, H, K]
            attention.update(measure(cudnn_op(None), make_inputs("attention", shape,
                                                                 jax.random.key(0))))
            cudnn[row_key(attention)] = attention
            add(attention)
        inputs = make_inputs(name, shape, jax.random.key(0))
        peer = fla.get(row_key({"op": name, **fields}))
        for impl, reason, fn in _candidates(name, shape, inputs, impls, tuned, variants):
            row = {"op": name, "impl": impl, **fields}
            if reason is not None:
                row["error"] = "refused: " + reason
            elif time.perf_counter() > deadline:
                row["error"] = "skipped: time limit"
            else:
                row.update(measure(fn, inputs))
            _ratios(row, peer, cudnn[row_key(attention)])
            add(row)
        if peer is not None:
            rows.append({**peer, "impl": "fla"})
    print_table(rows, COLUMNS)
    print_targets(rows)
    return rows


def print_targets(rows: list[dict], shape: MixerShape = TARGET_SHAPE) -> None:
    """The issue's targets at `shape`, for the fastest rung of ours per op."""
    at = lambda r, op: row_key(r) == row_key({"op": op, **shape.fields(op)})
    cudnn = next((r for r in rows if at(r, "attention")), None)
    for name, targets in TARGETS.items():
        fla = next((r for r in rows if at(r, name) and r["impl"] == "fla"), None)
        ours = [r for r in rows if at(r, name) and r["impl"] != "fla" and "fwd_bwd_ms" in r]
        for peer_name, key, factor in targets:
            peer = cudnn if peer_name == "cudnn" else fla
            best = min(ours, key=lambda r: r[key], default=None)
            if best is None or not peer or not peer.get(key):
                print(f"target {name} {key} vs {peer_name}: not measured")
                continue
            ratio = best[key] / peer[key]
            print(f"target {name} {key}: ours ({best['impl']}) {best[key]:.3g} ms = "
                  f"{ratio:.2f} x {peer_name} {peer[key]:.3g} ms; needs <= {factor:.2f}: "
                  f"{'met' if ratio <= factor else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--parts", default="table", help="comma-separated: check,sweep,table")
    parser.add_argument("--shapes", default="4x8192,8x4096,2x16384",
                        help="comma-separated BxT, BxTxHxK[xV] or MODEL@BxT "
                             "(`mixer_shapes`; the targets' 4x8192 first)")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--impls", default=None,
                        help="comma-separated rungs of ours to time (default: every rung)")
    parser.add_argument("--variants", default="all",
                        help="kernel variants beside the pallas rung: all, none or "
                             "';'-separated labels (VARIANT_LABELS)")
    parser.add_argument("--check-changes", default="",
                        type=functools.partial(parse_changes, blocks=BlockSizes),
                        help="FIELD=VALUE,...: the SSD check with these BlockSizes fields "
                             "changed in every case's defaults (e.g. grads_summed_scores=True)")
    parser.add_argument("--fla", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--fla-timeout", type=float, default=None,
                        help="seconds for the fla peer (default: default_fla_timeout)")
    parser.add_argument("--fla-cache", default=None,
                        help="Triton cache directory for the fla peer (kernels and autotuning "
                             "results; reuse it across runs to skip fla's autotuning)")
    parser.add_argument("--fla-warm", type=int, default=0,
                        help="with --fla-cache: this many parallel warm-up workers compile "
                             "fla's autotuning configs first (its minutes of compiling)")
    parser.add_argument("--fla-runs", type=int, default=2,
                        help="runs of the fla peer (within --fla-timeout); its fastest times "
                             "are the ones compared")
    parser.add_argument("--sweep-seconds", type=float, default=110.0)
    parser.add_argument("--time-limit", type=float, default=1e9, help="seconds for the run")
    parser.add_argument("--out", default="linear_ops.json")
    args = parser.parse_args()
    unknown = sorted(set(args.ops.split(",")) - set(OPS))
    if unknown:
        parser.error(f"--ops: unknown {unknown}; expected some of {list(OPS)}")
    try:  # bad shapes or labels stop the run here, before the peer takes its minutes
        shape_jobs(args.shapes, args.ops.split(","))
        parse_variants(args.variants)
    except ValueError as e:
        parser.error(str(e))
    start = time.perf_counter()
    deadline = start + args.time_limit
    parts = args.parts.split(",")
    record = {"command": shlex.join(sys.argv), "rows": []}

    def save():
        write_json(args.out, "linear_ops", record["rows"], shapes=args.shapes,
                   dtype="bfloat16", quiet=True,
                   **{k: v for k, v in record.items() if k != "rows"})

    def emit(row):
        row["at_s"] = round(time.perf_counter() - start, 1)
        print(row, flush=True)
        record["rows"].append(row)
        save()

    peers = []
    if "table" in parts and args.fla:  # first: torch takes and frees the GPU before JAX
        timeout = args.fla_timeout or default_fla_timeout(args.ops, args.shapes)
        peers = fla_rows(args.shapes, args.ops, min(timeout, args.time_limit), args.fla_cache,
                         args.fla_warm, args.fla_runs)
    record["fla"] = peers
    print(device_name(), f"(fla peer done at {time.perf_counter() - start:.0f} s)", flush=True)
    if "check" in parts:
        record["check"] = part_check(args.check_changes)
        save()
    tuned = None
    if "sweep" in parts:
        sweep_deadline = min(deadline, time.perf_counter() + args.sweep_seconds)
        record["sweep"], tuned = part_sweep(make_inputs("ssd", TARGET_SHAPE, jax.random.key(0)),
                                            sweep_deadline)
        save()
    if "table" in parts:
        record["rows"] = []
        record["rows"] = part_table(args, peers, tuned, deadline, emit)
    print(f"total {time.perf_counter() - start:.0f} s")
    save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_with_logging(main)
