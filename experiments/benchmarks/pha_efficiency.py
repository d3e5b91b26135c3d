"""PHA-180M against attention-only-180M on one GPU (issue 16, item 7): training tokens/s and
memory at T = 2048 / 8192 / 32768, inference prefill + decode, and a per-branch profile.

    python -m experiments.benchmarks.pha_efficiency [--lengths 8192,2048,32768]
        [--tokens 32768] [--steps 5] [--parts train,profile,inference] [--time-limit 170]
        [--models pha-180m,attention-only-180m] [--pha-window 512] [--trace-top 20]
        [--no-scan] [--out pha_efficiency.json]

1. Training (`train_throughput.run_one`, the trainer's own step): the same global batch of
   `--tokens` tokens per step at every T (batch = tokens / T), synthetic packed documents
   (log-normal lengths, median 1024, with segment ids: the GSS branch runs the chunked DSS
   rung), vocabulary 32768, bf16 compute, float32 parameters and AdamW state, scanned layers
   (`--no-scan`: unrolled), no remat (a model that would need > 90 % of the device falls back
   to remat="full", the row says so). Memory is the compiled step's arguments + temporaries.
2. Profile at the first length: forward + backward (gradients w.r.t. the input and the
   parameters) of one block's branches alone and of one whole block (`block(x, ctx)`: branches,
   per-branch norms, mixing, residual) on `[B, T, d_model]` bf16 packed input (pha: gss,
   attention, dual_ffn; attention-only: attention, ffn), ms per layer and the compiled
   temporaries (MiB; for a branch alone they hold what its backward keeps); × the model's
   layers next to the step time says what limits the step, and "block − sum of branches" per
   model what the composition costs beyond its branches. Order (most wanted first, since
   `--time-limit` also skips the profile's later steps): the GSS branch, each model's whole
   block (the first model's traced with `jax.profiler`: its top `--trace-top` kernels by time,
   `trace_summary.py`, and its optimised HLO written next to `--out` as `*_block_hlo.txt`),
   the other branches, the GSS branch's pieces, each fwd+bwd on the branch's own activations
   (the in-projections u = norm(gelu(x W_u)), gate = x W_v; discretize + the DSS op, chunked
   "xla" rung, on that u; the output: D skip, W_uc, ⊙ gelu(gate), W_o; the DSS op alone on
   random u), then the GSS branch's trace (HLO in `*_gss_hlo.txt`).
3. Inference: prefill of `--prompt` tokens × `--decode-batch` rows into a decode cache
   (`model.decode`, what `generate` does), then `--new-tokens` single-token decode steps; tokens/s
   of each and the cache size (KV cache, GSS state).

`--pha-window W` adds `pha-180m-w{W}`: pha-180m with a sliding window of W keys on its
attention branch (the issue allows one; not the preset), compared like pha-180m. The last of
`--models` is the baseline of the ratios.

Parts run in the order of `--parts` (train: every length in order; profile: the first length);
`--time-limit` (seconds) skips the parts, and the profile's steps, that would start later
(listed at the end; `--parts` and `--lengths` run them in a second call). Prints one JSON
line per row, then the tables (with each model / the baseline ratios per T), and writes
`--out`.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks import trace_summary, train_throughput
from experiments.benchmarks.timing import (
    device_name,
    error_text,
    print_table,
    time_compiled,
    write_json,
)
from experiments.benchmarks.train_throughput import (
    VOCAB,
    matmul_tflops,
    model_config,
    random_batch,
    run_one,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import presets
from hybrid_jax.config import layer
from hybrid_jax.context import TokenContext
from hybrid_jax.flops import device_peak_flops
from hybrid_jax.nn.lm import create_model
from hybrid_jax.nn.pha import PHA_BRANCHES
from hybrid_jax.ops.dss import dss

MODELS = ("pha-180m", "attention-only-180m")  # --models: PHA first, the baseline last


def windowed_pha(window: int) -> str:
    """Registers `pha-180m-w{window}` (pha-180m, attention branch windowed) for this run."""
    name = f"pha-180m-w{window}"
    branches = tuple(layer("attention", **{**dict(b.options), "window": window})
                     if getattr(b, "type", b) == "attention" else b for b in PHA_BRANCHES)
    train_throughput.MODELS[name] = lambda: presets.pha_config("180m", branches=branches)
    return name


def _bf16(name: str, **changes):
    return model_config(name).replace(vocab_size=VOCAB, dtype="bfloat16", **changes)


def _grad(fn, *args):
    """The compiled forward + backward of `sum(fn(*args))` w.r.t. every argument."""
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)),
                            argnums=tuple(range(len(args)))))
    return grad.lower(*args).compile()


def _grad_row(row: dict, fn, *args):
    """`row` with fwd+bwd ms and the compiled temporaries (MiB) of `fn`; the compiled gradient
    (None on error, which the row reports)."""
    try:
        compiled = _grad(fn, *args)
        row["fwd_bwd_ms"] = time_compiled(compiled, *args, warmup=2, iters=5)
        memory = compiled.memory_analysis()
        if memory is not None:
            row["temp_MiB"] = memory.temp_size_in_bytes / 2**20
    except Exception as e:  # noqa: BLE001  (report and go on)
        row["error"] = error_text(e, 120)
        compiled = None
    print(row, flush=True)
    return compiled


def _total(outputs) -> jax.Array:
    return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(outputs))


def _module_grad_row(part: str, module, x: jax.Array, ctx: TokenContext):
    """`_grad_row` of `module(x, ctx)` w.r.t. x and its parameters: (row, compiled, args)."""
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    run = lambda x, params: nnx.merge(graphdef, params, rest)(x, ctx)  # noqa: E731
    row = {"part": part, "T": x.shape[1], "B": x.shape[0]}
    return row, _grad_row(row, run, x, params), (x, params)


def profile_steps(models: list[str], length: int, tokens: int, trace_top: int = 20,
                  trace_dir: str | None = None, hlo_stem: str | None = None):
    """`(label, run)` of the profile in the order it runs, each `run()` giving its rows, and
    each model's branch names. The steps: the
    GSS branch of `models[0]`, one whole block of every model (`models[0]`'s traced, its HLO
    written), the other branches, the GSS branch's pieces and its trace. fwd+bwd ms and
    temporaries of each, on `[B, length, d_model]` bf16 packed input."""
    batch = max(tokens // length, 1)
    host = random_batch(batch, length, packed=True)
    ctx = TokenContext.create((batch, length), positions=jnp.asarray(host["positions"]),
                              segment_ids=jnp.asarray(host["segment_ids"]))
    blocks, inputs, gss_compiled = {}, {}, {}
    for name in models:
        config = _bf16(name)
        blocks[name] = create_model(config.replace(layers=config.layers[:1])).blocks[0]
        inputs[name] = jax.random.normal(jax.random.key(0), (batch, length, config.d_model),
                                         jnp.bfloat16)
    first = models[0]

    def traced(model: str, what: str, compiled, args) -> list[dict]:
        if compiled is None:
            return []
        if hlo_stem:
            Path(f"{hlo_stem}_{what}_hlo.txt").write_text(compiled.as_text())
        return trace_rows(compiled, args, trace_top, trace_dir,
                          label=f"{model} {what}") if trace_top > 0 else []

    def branch(name: str, part: str, keep: bool = False):
        def run():
            row, compiled, args = _module_grad_row(f"{name} {part}", getattr(blocks[name], part),
                                                   inputs[name], ctx)
            if keep:
                gss_compiled["gss"] = compiled, args
            return [row]
        return run

    def block(name: str):
        def run():
            row, compiled, args = _module_grad_row(f"{name} block", blocks[name], inputs[name],
                                                   ctx)
            return [row] + (traced(name, "block", compiled, args) if name == first else [])
        return run

    has_gss = "gss" in blocks[first].names
    steps = [(f"{first} gss", branch(first, "gss", keep=True))] if has_gss else []
    steps += [(f"{name} block", block(name)) for name in models]
    steps += [(f"{name} {part}", branch(name, part)) for name in models
              for part in blocks[name].names if not (name == first and part == "gss")]
    if has_gss:
        steps += [("gss pieces", lambda: gss_piece_rows(blocks[first].gss, inputs[first], ctx)),
                  ("gss trace", lambda: traced(first, "gss", *gss_compiled.get("gss",
                                                                                (None, None))))]
    return steps, {name: blocks[name].names for name in models}


def block_minus_branches(rows: list[dict], models: list[str],
                         branches: dict[str, tuple[str, ...]]) -> list[dict]:
    """Per model, "block − Σ branches": fwd+bwd ms and temporaries of one whole block beyond its
    branches alone (norms, mixing, residual, and how the composition compiles)."""
    by = {r["part"]: r for r in rows if "fwd_bwd_ms" in r}
    out = []
    for name in models:
        parts = [by.get(f"{name} {b}") for b in ("block", *branches[name])]
        if all(parts):
            block, *alone = parts
            row = {"part": f"{name} block - sum of branches", "T": block["T"], "B": block["B"],
                   "fwd_bwd_ms": block["fwd_bwd_ms"] - sum(r["fwd_bwd_ms"] for r in alone)}
            if "temp_MiB" in block and all("temp_MiB" in r for r in alone):
                row["temp_MiB"] = block["temp_MiB"] - sum(r["temp_MiB"] for r in alone)
            out.append(row)
    return out


def gss_piece_rows(gss, x: jax.Array, ctx: TokenContext) -> list[dict]:
    """fwd+bwd of the GSS branch's pieces on its own activations (`GSSMixer`'s parts)."""
    graphdef, params, rest = nnx.split(gss, nnx.Param, ...)
    merged = lambda params: nnx.merge(graphdef, params, rest)  # noqa: E731
    u, gate = jax.jit(lambda x, params: merged(params).inputs(x))(x, params)
    log_decay, coeff = gss.discretize()

    def run_dss(u, log_decay, coeff):
        return dss(u, log_decay, coeff, segment_ids=ctx.segment_ids, chunk_size=gss.chunk_size,
                   implementation="xla")

    y = jax.jit(run_dss)(u, log_decay, coeff)
    batch, length = x.shape[:2]
    pieces = [
        ("gss in-projections: u = norm(gelu(x W_u)), gate = x W_v",
         lambda x, params: _total(merged(params).inputs(x)), (x, params)),
        ("gss discretize + dss op (xla) on the branch's u",
         lambda u, params: run_dss(u, *merged(params).discretize()), (u, params)),
        ("gss output: W_o(W_uc(y + D u) * gelu(gate))",
         lambda y, u, gate, params: merged(params).output(y, u, gate), (y, u, gate, params)),
        ("dss op alone (xla), random u",
         run_dss, (jax.random.normal(jax.random.key(1), u.shape, u.dtype), log_decay, coeff)),
    ]
    rows = []
    for part, fn, args in pieces:
        rows.append({"part": part, "T": length, "B": batch})
        _grad_row(rows[-1], fn, *args)
    return rows


def trace_rows(compiled, args, top: int, trace_dir: str | None, runs: int = 3,
               label: str = "gss") -> list[dict]:
    """The top kernels of `runs` calls of `compiled(*args)` under `jax.profiler.trace`, rows
    named `label kernel ...`."""
    try:
        summary = trace_summary.trace_calls(compiled, args, runs, trace_dir, prefix="pha_trace_")
    except Exception as e:  # noqa: BLE001  (a missing profiler plugin must not cost the rest)
        print(f"{label} trace failed: {error_text(e)}")
        return [{"part": f"{label} trace", "error": f"{type(e).__name__}: {str(e)[:160]}"}]
    print(label, flush=True)
    trace_summary.print_summary(summary, top)
    return [{"part": f"{label} kernel {r['name'][:90]}", "kernel_ms": r["ms_per_step"],
             "kernel_count": r["count"] // runs, "kernel_share_%": 100 * r["share"]}
            for r in summary["kernels"][:top]] + [
        {"part": f"{label} kernels: {r['category']}", "kernel_ms": r["ms_per_step"],
         "kernel_count": r["count"] // runs, "kernel_share_%": 100 * r["share"]}
        for r in summary["categories"]]


def inference_row(name: str, batch: int, prompt: int, new_tokens: int) -> dict:
    """Prefill tokens/s, decode tokens/s and the cache size of one model (bf16 parameters)."""
    row = {"model": name, "B": batch, "prompt": prompt, "new_tokens": new_tokens}
    try:
        model = create_model(_bf16(name, param_dtype="bfloat16"))
        graphdef, state = nnx.split(model)
        max_len = prompt + new_tokens

        @jax.jit
        def prefill(state, tokens):
            model = nnx.merge(graphdef, state)
            logits, cache = model.decode(tokens, model.init_cache(batch, max_len),
                                         fresh_cache=True)  # as generate's prefill
            return jnp.argmax(logits[:, -1], -1), cache

        @jax.jit
        def step(state, token, cache):
            logits, cache = nnx.merge(graphdef, state).decode(token[:, None], cache)
            return jnp.argmax(logits[:, -1], -1), cache

        tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (batch, prompt)),
                             jnp.int32)
        start = time.perf_counter()
        # Progress lines, so a run cut off by its time limit shows which phase it was in.
        prefill = prefill.lower(state, tokens).compile()
        print(f"{name}: prefill compiled in {time.perf_counter() - start:.1f} s", flush=True)
        begin = time.perf_counter()
        token, cache = jax.block_until_ready(prefill(state, tokens))
        print(f"{name}: first prefill ran in {time.perf_counter() - begin:.2f} s", flush=True)
        step = step.lower(state, token, cache).compile()
        row["compile_s"] = time.perf_counter() - start
        print(f"{name}: decode step compiled, {row['compile_s']:.1f} s in all", flush=True)
        row["prefill_ms"] = time_compiled(prefill, state, tokens, warmup=1, iters=3)
        row["prefill_tokens_per_s"] = batch * prompt / row["prefill_ms"] * 1e3
        row["cache_MiB"] = sum(x.nbytes for x in jax.tree.leaves(cache)) / 2**20
        print(f"{name}: prefill timed, {row['prefill_ms']:.1f} ms", flush=True)
        begin = time.perf_counter()
        jax.block_until_ready(step(state, token, cache))
        print(f"{name}: first decode step ran in {time.perf_counter() - begin:.2f} s", flush=True)
        times = []
        for _ in range(new_tokens):
            begin = time.perf_counter()
            token, cache = step(state, token, cache)
            jax.block_until_ready(token)
            times.append(time.perf_counter() - begin)
        row["decode_ms_per_step"] = statistics.median(times) * 1e3
        row["decode_tokens_per_s"] = batch / statistics.median(times)
    except Exception as e:  # noqa: BLE001
        row["error"] = error_text(e)
    print(row, flush=True)
    return row


def ratios(train_rows: list[dict], models: list[str]) -> list[dict]:
    """Each model / the baseline `models[-1]` (pha-180m / attention-only-180m), tokens/s and
    memory per T (the paper's +23.9 % tokens/s, −22.0 % memory at 8192; −39.6 % memory at
    2048)."""
    out = []
    by = {(r["model"], r["T"]): r for r in train_rows if "error" not in r}
    for length in sorted({r["T"] for r in train_rows}):
        base = by.get((models[-1], length))
        for name in models[:-1]:
            model = by.get((name, length))
            if model and base:
                out.append({"model": name, "T": length,
                            "tokens_per_s_change_%": 100 * (model["tokens_per_s"]
                                                            / base["tokens_per_s"] - 1),
                            "memory_change_%": 100 * (model["mem_GiB"] / base["mem_GiB"] - 1),
                            "remat": f"{model['remat']} / {base['remat']}"})
    return out


def plan(parts: list[str], lengths: list[int], prompt: int) -> list[tuple[str, int]]:
    """(part, length) in the order of `parts`: train at every length, profile at the first."""
    known = {"train", "profile", "inference"}
    if not parts or set(parts) - known:
        raise ValueError(f"--parts: expected some of {sorted(known)}, got {parts}")
    steps = []
    for part in parts:
        steps += ([("train", length) for length in lengths] if part == "train" else
                  [("profile", lengths[0])] if part == "profile" else [("inference", prompt)])
    return steps


def main(argv=None) -> int:
    # A run cut off by `timeout` (SIGTERM) prints where every thread was.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--pha-window", type=int, default=0,
                        help="also pha-180m with this sliding window on its attention branch")
    parser.add_argument("--lengths", default="8192,2048,32768")
    parser.add_argument("--scan", action=argparse.BooleanOptionalAction, default=True,
                        help="training rows with scanned layers (unscanned: slower compile, "
                        "faster steps on one GPU, BENCHMARKS.md)")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--parts", default="train,profile,inference")
    parser.add_argument("--trace-top", type=int, default=20,
                        help="kernels of the traced GSS branch to list (0: no trace)")
    parser.add_argument("--time-limit", type=float, default=170.0,
                        help="seconds; parts that would start later are skipped")
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--out", default="pha_efficiency.json")
    args = parser.parse_args(argv)
    # What train_throughput.run_one reads besides --scan, --tokens and --steps (and
    # matmul_tflops / peak, set below): synthetic documents, no remat, each layer's own conv and
    # NHA rungs (and an Oryx mode schedule, which these models do not read).
    args.data, args.remat, args.conv, args.nha = "", "none", None, None
    args.oryx_modes = "random_chunks"
    start = time.perf_counter()
    over = lambda: time.perf_counter() - start > args.time_limit  # noqa: E731
    lengths = [int(x) for x in args.lengths.split(",")]
    models = args.models.split(",")
    if args.pha_window:
        models.insert(len(models) - 1, windowed_pha(args.pha_window))
    schedule = plan(args.parts.split(","), lengths, args.prompt)
    print(device_name(), flush=True)
    args.peak = device_peak_flops()
    args.matmul_tflops = matmul_tflops(args.matmul_size)
    out = Path(args.out)
    train_rows, profile, inference, skipped = [], [], [], []
    for part, length in schedule:
        if over():
            skipped.append(f"{part} T={length}")
            continue
        if part == "train":
            train_rows += [run_one(name, length, args, packed=True) for name in models]
        elif part == "profile":
            steps, branches = profile_steps(models, length, args.tokens, args.trace_top,
                                            hlo_stem=str(out.with_name(out.stem)))
            for label, run in steps:
                if over():
                    skipped.append(f"profile {label}")
                else:
                    profile += run()
            profile += block_minus_branches(profile, models, branches)
        else:
            inference = [inference_row(name, args.decode_batch, args.prompt, args.new_tokens)
                         for name in models]
    step_ms = {r["model"]: r.get("step_ms") for r in train_rows if r["T"] == lengths[0]}
    depth = {name: len(model_config(name).layers) for name in models}
    for row in profile:
        model = next((m for m in models if row["part"].startswith(m + " ")), models[0])
        if "fwd_bwd_ms" in row and step_ms.get(model):
            row["x_layers_share_of_step_%"] = 100 * row["fwd_bwd_ms"] * depth[model] / step_ms[
                model]
    kernels = [r for r in profile if "kernel_ms" in r]
    tables = [(train_rows, ["model", "T", "B", "tokens_per_s", "tflops", "mfu_model_matmul",
                            "mem_GiB", "remat", "compile_s", "step_ms", "error"]),
              (ratios(train_rows, models), ["model", "T", "tokens_per_s_change_%",
                                            "memory_change_%", "remat"]),
              ([r for r in profile if "kernel_ms" not in r],
               ["part", "T", "B", "fwd_bwd_ms", "temp_MiB", "x_layers_share_of_step_%",
                "error"]),
              (kernels, ["part", "kernel_ms", "kernel_count", "kernel_share_%"]),
              (inference, ["model", "B", "prompt", "prefill_tokens_per_s", "decode_tokens_per_s",
                           "decode_ms_per_step", "cache_MiB", "compile_s", "error"])]
    for rows, columns in tables:
        if rows:
            print_table(rows, columns)
    if skipped:
        print("skipped (time limit):", ", ".join(skipped))
    write_json(args.out, "pha_efficiency", train_rows, ratios=ratios(train_rows, models),
               profile=profile, inference=inference, skipped=skipped,
               matmul_tflops=args.matmul_tflops, peak_tflops=(args.peak or 0) / 1e12,
               tokens_per_step=args.tokens, command=" ".join(sys.argv),
               wall_s=time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
