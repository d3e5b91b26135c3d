"""flash-linear-attention's (fla) chunk kernels at the shapes of `linear_ops.py`, fwd and fwd+bwd.

    python3 -m experiments.benchmarks.peers.fla_linear [--shapes 4x8192,8x4096,2x16384]
        [--ops ssd,gated_delta_rule,gated_slot_attention] [--iters 10] [--profile]

Run by `linear_ops.py` in its own process before JAX takes the GPU; needs torch and fla
(`fla-core` 0.6: `fla.ops`), neither a dependency of hybrid_jax. `--shapes` as in linear_ops
(`mixer_shapes`: `BxT` is H16, K = V = 128; `BxTxHxK[xV]`; `MODEL@BxT`, read from the preset
with JAX kept off the GPU), parsed by the same `shape_jobs`, so both measure the same (op,
shape) jobs in the same order and each row carries its shape fields (B, T, H, K, V, G / M),
which pair it with ours. bf16, layout [B, T, H, D] (fla 0.6 has no `head_first`), gates in log
space:
  ssd                   chunk_simple_gla(q=C, k=B per head, v=dt·x, g=dt·A, scale=1): SSD
                        with its G B/C groups of N = K broadcast to the heads, x of P = V
                        (the inputs come prepared)
  gated_delta_rule      chunk_gated_delta_rule(q, k l2-normalised, v, g=−softplus, beta)
  gated_slot_attention  chunk_gsa(q, k, v, s=1−e^g, g=logsigmoid/8), M slots
fwd+bwd is the gradient of sum(o.float()) w.r.t. every input, as in linear_ops. fla's GDN and
SSD backward may fail on Triton 3.6 on Hopper (fla issue #640): that row says "refused" with
the error instead of stopping the run.

Prints one JSON line per (op, shape) as soon as it is measured, flushed, shapes in the order
given (the targets' 4 × 8192 first): first the row with the forward only (`"partial": true`),
then the whole row, which replaces it (`linear_ops` keeps the last row per op and shape, so a
run cut off by its time limit keeps what it finished). `first_call_s` is the wall time of the
first forward and of the first fwd+bwd: Triton compiling and autotuning fla's kernels, ~a
minute for an op's first shape, seconds for its next (the autotuning keys hold no lengths).

Warm-up workers (`autotune_warm`; `FLA_PEER_WARM=i/n` in the environment, started by
`linear_ops --fla-warm n` before the measured run, sharing its Triton cache): worker i
autotunes each kernel over its slice of the configs only (every n-th) and caches no choice, so
n workers compile all of fla's configs in parallel (compiling, on the CPU, is what takes
`chunk_gsa` minutes). The measured run then autotunes over every config as fla does, from
compiled kernels.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from experiments.benchmarks.mixer_shapes import MixerShape, shape_jobs
from experiments.benchmarks.peers.autotune_warm import WARM_VARIABLE, restrict_autotuning


def make_inputs(name: str, shape: MixerShape) -> tuple[tuple[torch.Tensor, ...], dict]:
    """fla's arguments (positional, keyword) for one op, bf16 except float32 log decays."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    normal = lambda *dims: torch.randn(*dims, device="cuda", generator=gen)
    bf16 = torch.bfloat16
    batch, length, heads = shape.batch, shape.length, shape.heads
    bthk, bthv = (batch, length, heads, shape.key_dim), (batch, length, heads, shape.value_dim)
    if name == "ssd":  # head h reads group h // (H / G)
        dt = F.softplus(normal(batch, length, heads) - 3.0)
        A = -torch.exp(torch.rand(heads, device="cuda", generator=gen) * 2.7)
        x = normal(*bthv)
        B, C = (normal(batch, length, shape.groups, shape.key_dim)
                .repeat_interleave(heads // shape.groups, dim=2) for _ in range(2))
        v = (x * dt[..., None]).to(bf16)
        return (C.to(bf16), B.to(bf16), v, dt * A), {"scale": 1.0}
    if name == "gated_delta_rule":
        q, k = (F.normalize(normal(*bthk), dim=-1).to(bf16) for _ in range(2))
        g = -F.softplus(normal(batch, length, heads))
        beta = torch.sigmoid(normal(batch, length, heads)).to(bf16)
        return (q, k, normal(*bthv).to(bf16), g, beta), {}
    if name == "gated_slot_attention":
        g = F.logsigmoid(normal(batch, length, heads, shape.slots)) / 8
        s = 1 - torch.exp(g)
        q, k, v = (normal(*dims).to(bf16) for dims in (bthk, bthk, bthv))
        return (q, k, v, s.to(bf16), g.to(bf16)), {}
    raise ValueError(name)


def fla_op(name: str):
    if name == "ssd":
        from fla.ops.simple_gla import chunk_simple_gla
        return chunk_simple_gla
    if name == "gated_delta_rule":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        return chunk_gated_delta_rule
    if name == "gated_slot_attention":
        from fla.ops.gsa import chunk_gsa
        return chunk_gsa
    raise ValueError(name)


CALLS = 5  # back-to-back calls per repeat, as `timing.CALLS` on our side (no JAX here)


WARMUP_S = 0.5  # as `timing.WARMUP_S` on our side (no JAX here)


def time_ms(fn, warmup: int = 2, iters: int = 10, calls: int = CALLS) -> float:
    """Median over `iters` repeats of the CUDA-event time per call of `calls` back-to-back
    calls, after `warmup` calls and at least `WARMUP_S` seconds of them (warm-up calls also
    run fla's Triton autotuning)."""
    start = time.perf_counter()
    for i in itertools.count():
        fn()
        torch.cuda.synchronize()
        if i + 1 >= warmup and time.perf_counter() - start >= WARMUP_S:
            break
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def _first_call_s(fn) -> float:
    """Wall seconds of one call, synchronised (on a fresh op: compiling and autotuning)."""
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _emit(row: dict) -> None:
    print(json.dumps(row), flush=True)


def _error(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"


def run_one(name: str, shape: MixerShape, iters: int) -> dict:
    row = {"op": name, "impl": "fla", **shape.fields(name), "first_call_s": {}}
    op = fla_op(name)
    args, kwargs = make_inputs(name, shape)

    def forward():
        with torch.no_grad():
            return op(*args, **kwargs)[0]

    try:
        row["first_call_s"]["fwd"] = _first_call_s(forward)
        row["fwd_ms"] = time_ms(forward, iters=iters)
    except Exception as e:  # noqa: BLE001  (report and go on)
        row["error"] = "fwd refused: " + _error(e)
        return row
    _emit({**row, "partial": True})
    leaves = [a.detach().requires_grad_(a.is_floating_point()) for a in args]

    def forward_backward():
        for a in leaves:
            a.grad = None
        out = op(*leaves, **kwargs)[0]
        out.float().sum().backward()

    try:
        row["first_call_s"]["fwd_bwd"] = _first_call_s(forward_backward)
        row["fwd_bwd_ms"] = time_ms(forward_backward, iters=iters)
    except Exception as e:  # noqa: BLE001  (fla #640: its backward refuses on Triton 3.6)
        row["error"] = "fwd+bwd refused: " + _error(e)
    row["peak_GiB"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def profile_forward(name: str, shape: MixerShape, calls: int = 10) -> dict:
    """fla's forward kernels: device ms per call of each, from torch's profiler over `calls`
    calls after a warm-up (autotuning) call, largest first."""
    from torch.profiler import ProfilerActivity, profile

    op = fla_op(name)
    args, kwargs = make_inputs(name, shape)
    with torch.no_grad():
        op(*args, **kwargs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                op(*args, **kwargs)
            torch.cuda.synchronize()
    kernels = {}  # the kernels: the rows with device time of their own (a CPU op has none)
    for row in prof.key_averages():
        own = getattr(row, "self_device_time_total", None) or getattr(
            row, "self_cuda_time_total", 0.0)
        if own:
            kernels[row.key] = own / 1e3 / calls
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1])
    return {"op": name, "impl": "fla", **shape.fields(name), "profile": "fwd",
            "kernels_ms": {k: round(v, 4) for k, v in ranked},
            "total_ms": round(sum(kernels.values()), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x8192,8x4096,2x16384")
    parser.add_argument("--ops", default="ssd,gated_delta_rule,gated_slot_attention")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--profile", action="store_true",
                        help="instead of timing: each op's forward kernels (torch profiler)")
    args = parser.parse_args()
    # A model shape reads its preset through hybrid_jax, which imports JAX: keep it on the CPU
    # (it starts no backend; this makes sure it never takes the GPU from torch).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jobs, _ = shape_jobs(args.shapes, args.ops.split(","))
    if os.environ.get(WARM_VARIABLE):
        restrict_autotuning(os.environ[WARM_VARIABLE])
    import fla

    _emit({"fla_version": getattr(fla, "__version__", "?"), "torch": torch.__version__,
           "device": torch.cuda.get_device_name()})
    for name, shape in jobs:
        try:
            row = (profile_forward if args.profile else run_one)(name, shape, args.iters)
        except Exception as e:  # noqa: BLE001  (e.g. out of memory building the inputs)
            row = {"op": name, "impl": "fla", **shape.fields(name), "error": _error(e)}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        _emit(row)


if __name__ == "__main__":
    main()
