"""PHA-180M against attention-only-180M on one GPU (issue 16, item 7): training tokens/s and
memory at T = 2048 / 8192 / 32768, inference prefill + decode, and a per-branch profile.

    python -m experiments.benchmarks.pha_efficiency [--lengths 8192,2048,32768]
        [--tokens 32768] [--steps 5] [--parts train,profile,inference] [--time-limit 170]
        [--out pha_efficiency.json]

1. Training (`train_throughput.run_one`, the trainer's own step): the same global batch of
   `--tokens` tokens per step at every T (batch = tokens / T), synthetic packed documents
   (log-normal lengths, median 1024, with segment ids: the GSS branch runs the chunked DSS
   rung), vocabulary 32768, bf16 compute, float32 parameters and AdamW state, scanned layers, no
   remat (a model that would need > 90 % of the device falls back to remat="full", the row
   says so). Memory is the compiled step's arguments + temporaries.
2. Per-branch profile at the first length: forward + backward (gradients w.r.t. the input and
   the branch's parameters) of each branch of one block alone on `[B, T, 768]` bf16 packed input
   (pha: gss, attention, dual_ffn; attention-only: attention, ffn), and of the DSS op alone,
   chunked ("xla") against the per-token associative scan ("scan") it replaced. ms per layer;
   × 14 layers next to the step time says what limits the step.
3. Inference: prefill of `--prompt` tokens × `--decode-batch` rows into a decode cache
   (`model.decode`, what `generate` does), then `--new-tokens` single-token decode steps; tokens/s
   of each and the cache size (KV cache, GSS state).

Order: training at the first length, the profile, training at the other lengths, inference;
`--time-limit` (seconds) skips the parts that would start later (listed at the end; `--parts`
and `--lengths` run them in a second call). Prints one JSON line per row, then the tables
(with pha / attention-only ratios per T), and writes `--out`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from experiments.benchmarks.timing import device_name, print_table, time_compiled, write_json
from experiments.benchmarks.train_throughput import VOCAB, matmul_tflops, random_batch, run_one
from hybrid_jax import presets
from hybrid_jax.context import TokenContext
from hybrid_jax.flops import device_peak_flops
from hybrid_jax.nn.lm import create_model
from hybrid_jax.ops.dss import dss

MODELS = ("pha-180m", "attention-only-180m")  # --models: the pair to compare (PHA first)


def _bf16(name: str, **changes):
    return presets.get(name).replace(vocab_size=VOCAB, dtype="bfloat16", **changes)


def _grad_ms(fn, *args) -> float:
    """Median ms of forward + backward of `sum(fn(*args))` w.r.t. every argument."""
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)),
                            argnums=tuple(range(len(args)))))
    return time_compiled(grad.lower(*args).compile(), *args, warmup=2, iters=5)


def branch_rows(models: list[str], length: int, tokens: int) -> list[dict]:
    """fwd+bwd ms of each branch of one block, and of the DSS op's rungs, at `length`."""
    batch = max(tokens // length, 1)
    host = random_batch(batch, length, packed=True)
    ctx = TokenContext.create((batch, length), positions=jnp.asarray(host["positions"]),
                              segment_ids=jnp.asarray(host["segment_ids"]))
    rows = []
    for name in models:
        config = _bf16(name)
        block = create_model(config.replace(layers=config.layers[:1])).blocks[0]
        x = jax.random.normal(jax.random.key(0), (batch, length, config.d_model), jnp.bfloat16)
        for branch in block.names:
            graphdef, params, rest = nnx.split(getattr(block, branch), nnx.Param, ...)
            run = (lambda x, params, graphdef=graphdef, rest=rest:
                   nnx.merge(graphdef, params, rest)(x, ctx))
            row = {"part": f"{name} {branch}", "T": length, "B": batch}
            try:
                row["fwd_bwd_ms"] = _grad_ms(run, x, params)
            except Exception as e:  # noqa: BLE001  (report and go on)
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            rows.append(row)
            print(rows[-1], flush=True)
        if "gss" in block.names:
            rows += _dss_rows(block.gss, batch, length, ctx.segment_ids)
    return rows


def _dss_rows(gss, batch: int, length: int, segment_ids) -> list[dict]:
    log_decay, coeff = gss.discretize()
    u = jax.random.normal(jax.random.key(1), (batch, length, log_decay.shape[0]), jnp.bfloat16)
    rows = []
    for implementation in ("xla", "scan"):
        row = {"part": f"dss op alone ({implementation})", "T": length, "B": batch}
        try:
            row["fwd_bwd_ms"] = _grad_ms(
                lambda u, a, c, impl=implementation: dss(u, a, c, segment_ids=segment_ids,
                                                         implementation=impl), u, log_decay,
                coeff)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        rows.append(row)
        print(row, flush=True)
    return rows


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
            logits, cache = model.decode(tokens, model.init_cache(batch, max_len))
            return jnp.argmax(logits[:, -1], -1), cache

        @jax.jit
        def step(state, token, cache):
            logits, cache = nnx.merge(graphdef, state).decode(token[:, None], cache)
            return jnp.argmax(logits[:, -1], -1), cache

        tokens = jnp.asarray(np.random.default_rng(0).integers(0, VOCAB, (batch, prompt)),
                             jnp.int32)
        start = time.perf_counter()
        prefill = prefill.lower(state, tokens).compile()
        token, cache = prefill(state, tokens)
        step = step.lower(state, token, cache).compile()
        row["compile_s"] = time.perf_counter() - start
        row["prefill_ms"] = time_compiled(prefill, state, tokens, warmup=1, iters=3)
        row["prefill_tokens_per_s"] = batch * prompt / row["prefill_ms"] * 1e3
        row["cache_MiB"] = sum(x.nbytes for x in jax.tree.leaves(cache)) / 2**20
        jax.block_until_ready(step(state, token, cache))
        times = []
        for _ in range(new_tokens):
            begin = time.perf_counter()
            token, cache = step(state, token, cache)
            jax.block_until_ready(token)
            times.append(time.perf_counter() - begin)
        row["decode_ms_per_step"] = statistics.median(times) * 1e3
        row["decode_tokens_per_s"] = batch / statistics.median(times)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    print(row, flush=True)
    return row


def ratios(train_rows: list[dict], models: list[str]) -> list[dict]:
    """models[0] / models[1] (pha-180m / attention-only-180m) tokens/s and memory per T (the
    paper's +23.9 % tokens/s, −22.0 % memory at 8192; −39.6 % memory at 2048)."""
    out = []
    by = {(r["model"], r["T"]): r for r in train_rows if "error" not in r}
    for length in sorted({r["T"] for r in train_rows}):
        pha, base = by.get((models[0], length)), by.get((models[1], length))
        if pha and base:
            out.append({"T": length,
                        "tokens_per_s_change_%": 100 * (pha["tokens_per_s"]
                                                        / base["tokens_per_s"] - 1),
                        "memory_change_%": 100 * (pha["mem_GiB"] / base["mem_GiB"] - 1),
                        "remat": f"{pha['remat']} / {base['remat']}"})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--lengths", default="8192,2048,32768")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--decode-batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--parts", default="train,profile,inference")
    parser.add_argument("--time-limit", type=float, default=170.0,
                        help="seconds; parts that would start later are skipped")
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--out", default="pha_efficiency.json")
    args = parser.parse_args(argv)
    # What train_throughput.run_one reads.
    args.data, args.scan, args.remat = "", True, "none"
    start = time.perf_counter()
    over = lambda: time.perf_counter() - start > args.time_limit
    lengths = [int(x) for x in args.lengths.split(",")]
    models = args.models.split(",")
    print(device_name(), flush=True)
    args.peak = device_peak_flops()
    args.matmul_tflops = matmul_tflops(args.matmul_size)
    train_rows, profile, inference, skipped = [], [], [], []
    plan = [("train", lengths[0]), ("profile", lengths[0]),
            *(("train", length) for length in lengths[1:]), ("inference", args.prompt)]
    plan = [(part, length) for part, length in plan if part in args.parts.split(",")]
    for part, length in plan:
        if over():
            skipped.append(f"{part} T={length}")
            continue
        if part == "train":
            train_rows += [run_one(name, length, args, packed=True) for name in models]
        elif part == "profile":
            profile = branch_rows(models, length, args.tokens)
        else:
            inference = [inference_row(name, args.decode_batch, args.prompt, args.new_tokens)
                         for name in models]
    step_ms = {r["model"]: r.get("step_ms") for r in train_rows if r["T"] == lengths[0]}
    depth = {name: len(presets.get(name).layers) for name in models}
    for row in profile:
        model = next((m for m in models if row["part"].startswith(m)), models[0])
        if "fwd_bwd_ms" in row and step_ms.get(model):
            row["x_layers_share_of_step_%"] = 100 * row["fwd_bwd_ms"] * depth[model] / step_ms[
                model]
    tables = [(train_rows, ["model", "T", "B", "tokens_per_s", "tflops", "mfu_matmul", "mem_GiB",
                            "remat", "compile_s", "step_ms", "error"]),
              (ratios(train_rows, models), ["T", "tokens_per_s_change_%", "memory_change_%",
                                            "remat"]),
              (profile, ["part", "T", "B", "fwd_bwd_ms", "x_layers_share_of_step_%", "error"]),
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
    raise SystemExit(main())
