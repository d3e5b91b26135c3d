"""Full training steps (forward, backward, AdamW) on packed real text: tokens/s, TFLOP/s and MFU
per device, memory and compile time, next to a PyTorch GPT of the same shapes.

    python -m experiments.benchmarks.train_throughput --data wikitext2_bpe32k.npz
        [--models transformer-125m,transformer-350m,gdn-340m,mamba2-130m,nha-340m,
                  nha-hybrid-340m] [--lengths 2048,8192,32768] [--tokens 32768] [--steps 10]
        [--scan/--no-scan] [--remat none] [--unpacked transformer-125m]
        [--torch transformer-125m] [--compile-check transformer-350m]
        [--ablate transformer-125m] [--out F.json]

Batches: `--tokens` per step (batch = tokens / T) cut by `PackedWindows` from a token file
(`packed_data.py`: WikiText-2 articles, BPE 32768), so each row holds whole and cut documents
with their segment ids and restarting positions, as the trainer feeds them. Without `--data`
the documents are synthetic (log-normal lengths, median 1024) over random tokens; the table
says which. `--unpacked` adds runs on random tokens without segment ids (the packing cost).
Every model: vocabulary 32768, bf16 compute, float32 parameters and AdamW state, the
trainer's own `init_train_state` / `make_train_step`. FLOPs per token from `hybrid_jax.flops`
(the trainer's MFU); MFU against the dense bf16 peak and against a bf16 8192³ matmul measured
in the same run. Memory: what the compiled step needs (arguments + temporaries); a model that
needs more than 90 % of the device without remat is run with `remat="full"`. The PyTorch
peers run first, each in its own process (before JAX takes the GPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.flash_attention import packed_segments
from experiments.benchmarks.packed_data import document_stats, packed_batches
from experiments.benchmarks.timing import device_name, print_table, write_json
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, TrainConfig, layer
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.flops import device_peak_flops, step_flops
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import init_train_state, make_train_step, to_device

VOCAB = 32768


MODELS = {name: (lambda name=name: presets.get(name)) for name in
          ("transformer-125m", "transformer-350m", "gdn-340m", "mamba2-130m", "nha-340m",
           "nha-hybrid-340m", "pha-180m", "attention-only-180m")}


def matmul_tflops(size: int = 8192) -> float:
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.bfloat16)
    f = jax.jit(lambda a: a @ a)
    jax.block_until_ready(f(a))
    start = time.perf_counter()
    for _ in range(20):
        out = f(a)
    jax.block_until_ready(out)
    return 2 * size ** 3 * 20 / (time.perf_counter() - start) / 1e12


def random_batch(batch: int, length: int, packed: bool, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, (batch, length + 1)).astype(np.int32)
    row = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
           "mask": np.ones((batch, length), bool)}
    if packed:
        ids = packed_segments(batch, length, 1024, seed)
        starts = np.concatenate([np.ones((batch, 1), bool), ids[:, 1:] != ids[:, :-1]], 1)
        index = np.arange(length)
        row["segment_ids"] = ids + 1
        row["positions"] = (index - np.maximum.accumulate(np.where(starts, index, 0), 1)
                            ).astype(np.int32)
    return row


def with_attention(config: ModelConfig, implementation: str | None) -> ModelConfig:
    """`config` with every attention layer forced to an `ops.attention` implementation."""
    if implementation is None:
        return config
    return config.replace(layers=tuple(
        layer("attention", **{**dict(spec.options), "implementation": implementation})
        if spec.type == "attention" else spec for spec in config.layers))


def run_one(name: str, length: int, args, *, packed: bool, scan: bool | None = None,
            steps: int | None = None, attention: str | None = None) -> dict:
    scan = args.scan if scan is None else scan
    config = with_attention(MODELS[name](), attention).replace(
        vocab_size=VOCAB, dtype="bfloat16", param_dtype="float32", remat=args.remat,
        scan_layers=scan)
    batch = max(args.tokens // length, 1)
    row = {"model": name, "T": length, "B": batch, "scan": scan, "remat": args.remat,
           "attn": attention or "auto",
           "data": ("text" if args.data else "synthetic") if packed else "random, unpacked"}
    try:
        # The benchmark feeds its own batches; the data config only has to be a valid one.
        experiment = ExperimentConfig(name=name, model=config, data=MQARConfig(),
                                      train=TrainConfig(batch_size=batch, steps=100,
                                                        learning_rate=3e-4, warmup_steps=10))
        mesh = make_mesh(MeshConfig())
        if packed and args.data:
            host = packed_batches(args.data, batch, length, 4, seed=length)
            row.update(document_stats(host))
        else:
            host = [random_batch(batch, length, packed, seed) for seed in range(4)]
        with jax.set_mesh(mesh):
            ts = init_train_state(experiment, mesh)
            batches = [to_device(b, mesh) for b in host]
            start = time.perf_counter()
            step = make_train_step(ts).lower(ts.state, batches[0]).compile()
            row["compile_s"] = time.perf_counter() - start
            row["mem_GiB"] = _memory_gib(step)
            if args.remat == "none" and row["mem_GiB"] > 0.9 * _device_gib():
                # Too large for the device without remat: rematerialise every block.
                config, row["remat"] = config.replace(remat="full"), "full"
                ts = init_train_state(dataclasses.replace(experiment, model=config), mesh)
                start = time.perf_counter()
                step = make_train_step(ts).lower(ts.state, batches[0]).compile()
                row["compile_s"] = time.perf_counter() - start
                row["mem_GiB"] = _memory_gib(step)
            state = ts.state
            for i in range(2):
                state, metrics = step(state, batches[i % 4])
            jax.block_until_ready(metrics)
            steps = steps or args.steps
            start = time.perf_counter()
            for i in range(steps):
                state, metrics = step(state, batches[i % 4])
            loss = float(metrics["loss"])
            seconds = (time.perf_counter() - start) / steps
        flops = step_flops(config, length)
        row.update(step_ms=seconds * 1e3, tokens_per_s=batch * length / seconds, loss=loss,
                   tflops=flops.training_per_token * batch * length / seconds / 1e12)
        row["mfu_peak"] = row["tflops"] * 1e12 / args.peak if args.peak else None
        row["mfu_matmul"] = row["tflops"] / args.matmul_tflops
    except Exception as e:  # noqa: BLE001  (out of memory and the like: report, go on)
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    print(json.dumps(row), flush=True)
    return row


def _memory_gib(compiled) -> float:
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 2**30


def _device_gib() -> float:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit", 2**62) / 2**30


def torch_peer(name: str, length: int, args) -> dict:
    config = MODELS[name]()
    batch = max(args.tokens // length, 1)
    command = [sys.executable, "-m", "experiments.benchmarks.peers.torch_gpt",
               "--layers", str(len(config.layers)), "--d-model", str(config.d_model),
               "--heads", str(config.num_heads), "--ffn", str(config.resolved_ffn_dim),
               "--vocab", str(VOCAB), "--batch", str(batch), "--length", str(length),
               "--steps", str(args.steps)]
    row = {"model": name, "T": length, "B": batch, "data": "random (torch)"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    try:
        peer = json.loads(done.stdout.strip().splitlines()[-1])
        row.update(impl="torch", compile_s=peer["compile_s"], step_ms=peer["step_ms"],
                   tokens_per_s=peer["tokens_per_s"], mem_GiB=peer["peak_GiB"])
    except (IndexError, json.JSONDecodeError, KeyError):
        row["error"] = "torch peer failed: " + done.stderr[-300:]
    print(json.dumps(row), flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="")
    parser.add_argument("--models", default=",".join(
        ["transformer-125m", "transformer-350m", "gdn-340m", "mamba2-130m", "nha-340m",
         "nha-hybrid-340m"]))
    parser.add_argument("--lengths", default="2048,8192,32768")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--scan", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--remat", default="none")
    parser.add_argument("--unpacked", default="transformer-125m")
    parser.add_argument("--torch", default="transformer-125m")
    parser.add_argument("--compile-check", default="")
    parser.add_argument("--ablate", default="", help="models to rerun at the first length with "
                        "attention forced: pallas unpacked, xla packed (the kernel's share)")
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--time-limit", type=float, default=1e9, help="seconds; skip the rest")
    parser.add_argument("--out", default="train_throughput.json")
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    split = lambda s: [x for x in s.split(",") if x]
    start, rows = time.perf_counter(), []
    over = lambda: time.perf_counter() - start > args.time_limit
    for name in split(args.torch):  # first: torch gets the GPU before JAX takes it
        for length in lengths:
            rows.append(torch_peer(name, length, args))
    print(device_name(), flush=True)
    args.peak = device_peak_flops()
    args.matmul_tflops = matmul_tflops(args.matmul_size)
    print(f"bf16 matmul {args.matmul_size}³: {args.matmul_tflops:.0f} TFLOP/s; dense peak "
          f"{(args.peak or 0) / 1e12:.0f}", flush=True)
    for name in split(args.compile_check):  # the unscanned compile of a deep model
        if not over():
            rows.append(run_one(name, lengths[0], args, packed=True, scan=False, steps=3))
    for length in lengths:
        for name in split(args.models):
            if over():
                break
            rows.append(run_one(name, length, args, packed=True))
            if name in split(args.unpacked) and not over():
                rows.append(run_one(name, length, args, packed=False))
    for name in split(args.ablate):
        for packed, attention in ((False, "pallas"), (True, "xla")):
            if not over():
                rows.append(run_one(name, lengths[0], args, packed=packed, attention=attention))
    for row in rows:
        row.setdefault("impl", "jax")
    print_table(rows, ["model", "impl", "T", "B", "data", "attn", "scan", "remat", "tokens_per_s",
                       "tflops",
                       "mfu_peak", "mfu_matmul", "mem_GiB", "compile_s", "docs_per_row",
                       "error"])
    write_json(args.out, "train_throughput", rows, matmul_tflops=args.matmul_tflops,
               matmul_size=args.matmul_size,
               peak_tflops=(args.peak or 0) / 1e12, tokens_per_step=args.tokens,
               command=" ".join(sys.argv), xla_flags=os.environ.get("XLA_FLAGS", ""))


if __name__ == "__main__":
    main()
