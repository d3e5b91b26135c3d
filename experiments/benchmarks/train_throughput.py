"""Full training steps (forward, backward, AdamW) on packed real text: tokens/s, TFLOP/s and MFU
per device, memory and compile time, next to a PyTorch GPT of the same shapes.

    python -m experiments.benchmarks.train_throughput --data wikitext2_bpe32k.npz
        [--models transformer-125m,transformer-350m,gdn-340m,mamba2-130m,nha-340m,
                  nha-hybrid-340m] [--lengths 2048,8192,32768] [--tokens 32768] [--steps 10]
        [--scan] [--remat none] [--unpacked transformer-125m]
        [--torch transformer-125m] [--compile-check transformer-350m]
        [--ablate transformer-125m] [--unscanned transformer-125m]
        [--oryx-modes random_chunks] [--kernel-changes 'ssd:FIELD=VALUE,...;nha:...']
        [--out F.json]

Batches: `--tokens` per step (batch = tokens / T) cut by `PackedWindows` from a token file
(`packed_data.py`: WikiText-2 articles, BPE 32768; or books, e.g. a Gutenberg shard with
`--document-regex '^Produced by'`, whose ≈ 100k-token documents fill a row at T 8192 where
WikiText-2 packs 3.4 articles), so each row holds whole and cut documents with their segment
ids and restarting positions, as the trainer feeds them. Without `--data`
the documents are synthetic (log-normal lengths, median 1024) over random tokens; the table
says which. `--unpacked` adds runs on random tokens without segment ids (the packing cost).
Every model: vocabulary 32768, bf16 compute, float32 parameters and AdamW state, the
trainer's own `init_train_state` / `make_train_step`. FLOPs per token from `hybrid_jax.flops`
(the trainer's too): MFU against the dense bf16 peak and against a bf16 8192³ matmul measured
in the same run, by 6N (the target's count: `mfu_6n`, `mfu_6n_matmul`) and by the model count
with attention within each batch's documents (`tflops`, `mfu_model`, `mfu_model_matmul`;
`uncounted` names the block types whose sequence work that count leaves out).
Memory: what the compiled step needs (arguments + temporaries); a model that needs more than
90 % of the device without remat is run with `remat="full"`. The PyTorch
peers run first, each in its own process (before JAX takes the GPU), on random tokens; a
`--torch` model other than a plain multi-head transformer with tied embeddings (what the peer
builds) gets a row saying so instead. Same-run ratios:
`vs_base`, a row's tokens/s over `--baseline`'s (default: the first of `--models`) at the same
T, data, layer form and remat; `vs_torch`, over the PyTorch peer of the same model and T.
Layers are unscanned unless `--scan` (as `ModelConfig.scan_layers` defaults); `--unscanned`
reruns models unscanned beside a `--scan` run. Oryx models train under `--oryx-modes`, a
`ModeSchedule` pattern (default "random_chunks": chunks of 128 tokens, half in attention mode,
so the linear mixer runs on every token and attention on its half of the rows, as Oryx
trains); their rows say which in `modes` ("none" or "attention": every token in attention
mode, the linear mixer skipped).
`--kernel-changes` runs every JAX row with kernels' default tiles changed
(`timing.parse_kernel_changes`): a default-off option's model-level timing before it is a
default; the log (a "default tiles changed" line a kernel) and the JSON say which.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks.flash_attention import packed_segments
from experiments.benchmarks.packed_data import check_vocabulary, document_stats, packed_batches
from experiments.benchmarks.timing import (
    changed_kernel_defaults,
    device_name,
    error_text,
    parse_kernel_changes,
    print_table,
    write_json,
)
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import presets
from hybrid_jax.config import (
    ExperimentConfig,
    MeshConfig,
    ModelConfig,
    ModeSchedule,
    TrainConfig,
    layer,
)
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.flops import device_peak_flops, step_flops
from hybrid_jax.modes import attention_fraction
from hybrid_jax.registry import BLOCKS
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train.trainer import init_train_state, make_train_step, to_device

VOCAB = 32768


MODELS = {name: (lambda name=name: presets.get(name)) for name in
          ("transformer-125m", "transformer-350m", "gdn-340m", "mamba2-130m", "nha-340m",
           "nha-hybrid-340m", "pha-180m", "attention-only-180m")}


def model_config(name: str) -> ModelConfig:
    """A model of `MODELS`, else the preset of that name."""
    return MODELS[name]() if name in MODELS else presets.get(name)


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


def _forced(config: ModelConfig, option: str, value: str | None, chosen) -> ModelConfig:
    """`config` with layer option `option` set to `value` in every layer `chosen(spec)` picks
    (unchanged for None)."""
    if value is None:
        return config
    return config.replace(layers=tuple(
        layer(spec.type, **{**dict(spec.options), option: value}) if chosen(spec) else spec
        for spec in config.layers))


def with_attention(config: ModelConfig, implementation: str | None) -> ModelConfig:
    """`config` with every attention layer forced to an `ops.attention` implementation."""
    return _forced(config, "implementation", implementation,
                   lambda spec: spec.type == "attention")


def with_conv(config: ModelConfig, implementation: str | None) -> ModelConfig:
    """`config` with the short convolutions of every layer that has them (GDN, Mamba, NHA,
    Oryx: a `conv_implementation` option) forced to an `ops.short_conv` implementation."""
    return _forced(config, "conv_implementation", implementation, lambda spec: (
        "conv_implementation" in BLOCKS.get(spec.type).options.__dataclass_fields__))


def with_full_window_nha(config: ModelConfig, implementation: str | None) -> ModelConfig:
    """`config` with its full-window NHA layers (`window=None`: causal attention beside the
    slots) forced to an `ops.native_hybrid_attention` implementation, e.g. "attention"."""
    return _forced(config, "implementation", implementation, lambda spec: (
        spec.type == "nha" and dict(spec.options).get("window", 0) is None))


@dataclasses.dataclass
class Built:
    """A compiled train step of one benchmark row, its state and its batches."""

    config: ModelConfig
    step: Any  # the compiled step: state, metrics = step(state, batch)
    state: Any
    host: list[dict[str, np.ndarray]]  # the batches as numpy (segment ids for the FLOPs)
    batches: list[dict[str, jax.Array]]
    info: dict  # compile_s, mem_GiB, remat, document statistics
    params: Any  # the model's parameters, shapes only (for the FLOP count: no second trace)


def has_modes(config: ModelConfig) -> bool:
    """Whether `config` has Oryx blocks, whose per-token modes a `ModeSchedule` sets."""
    return any(spec.type == "oryx" for spec in config.layers)


def build_step(name: str, length: int, *, tokens: int, data: str, remat: str, scan: bool,
               packed: bool, attention: str | None = None, conv: str | None = None,
               nha: str | None = None, modes: str = "random_chunks") -> Built:
    """The trainer's own `init_train_state` / `make_train_step` for a benchmark row, compiled,
    with 4 batches on the device (module docstring: packed text from `data`, or synthetic);
    Oryx models train under the `ModeSchedule` pattern `modes`."""
    config = with_full_window_nha(with_conv(with_attention(model_config(name), attention), conv),
                                  nha).replace(
        vocab_size=VOCAB, dtype="bfloat16", param_dtype="float32", remat=remat,
        scan_layers=scan)
    batch = max(tokens // length, 1)
    info = {"modes": modes} if has_modes(config) else {}
    schedule = ModeSchedule(pattern=modes)
    # The benchmark feeds its own batches; the data config only has to be a valid one.
    experiment = ExperimentConfig(name=name, model=config, data=MQARConfig(),
                                  train=TrainConfig(batch_size=batch, steps=100,
                                                    learning_rate=3e-4, warmup_steps=10))
    mesh = make_mesh(MeshConfig())
    if packed and data:
        host = packed_batches(data, batch, length, 4, seed=length, vocab_size=VOCAB)
        info.update(document_stats(host))
    else:
        host = [random_batch(batch, length, packed, seed) for seed in range(4)]
    with jax.set_mesh(mesh):
        ts = init_train_state(experiment, mesh)
        batches = [to_device(b, mesh) for b in host]
        start = time.perf_counter()
        step = make_train_step(ts, modes=schedule).lower(ts.state, batches[0]).compile()
        info["compile_s"] = time.perf_counter() - start
        info["mem_GiB"] = _memory_gib(step)
        if remat == "none" and info["mem_GiB"] > 0.9 * _device_gib():
            # Too large for the device without remat: rematerialise every block.
            config, info["remat"] = config.replace(remat="full"), "full"
            ts = init_train_state(dataclasses.replace(experiment, model=config), mesh)
            start = time.perf_counter()
            step = make_train_step(ts, modes=schedule).lower(ts.state, batches[0]).compile()
            info["compile_s"] = time.perf_counter() - start
            info["mem_GiB"] = _memory_gib(step)
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), ts.params)
    return Built(config, step, ts.state, host, batches, info, params)


def flops_columns(config: ModelConfig, host: list[dict[str, np.ndarray]], seconds: float,
                  peak: float | None, matmul_tflops: float, params: Any = None,
                  modes: str = "random_chunks") -> dict:
    """TFLOP/s by the model count (attention within the batches' documents, Oryx's under the
    `ModeSchedule` pattern `modes`) and MFU by 6N and by the model count, against the dense
    peak and the same-run matmul (`hybrid_jax.flops`); `uncounted`: the block types whose
    sequence work the model count leaves out."""
    batch, length = host[0]["inputs"].shape
    flops = step_flops(config, length, params,
                       attention_fraction=attention_fraction(ModeSchedule(pattern=modes)))
    model = float(np.mean([flops.training_per_token(b.get("segment_ids")) for b in host]))
    per_s = batch * length / seconds
    row = {"tflops": model * per_s / 1e12, "tflops_6n": flops.six_n * per_s / 1e12,
           "uncounted": ",".join(flops.uncounted) or None}
    for count in ("6n", "model"):
        achieved = row["tflops_6n" if count == "6n" else "tflops"]
        row[f"mfu_{count}"] = achieved * 1e12 / peak if peak else None
        row[f"mfu_{count}_matmul"] = achieved / matmul_tflops
    return row


def run_one(name: str, length: int, args, *, packed: bool, scan: bool | None = None,
            steps: int | None = None, attention: str | None = None) -> dict:
    scan = args.scan if scan is None else scan
    batch = max(args.tokens // length, 1)
    row = {"model": name, "T": length, "B": batch, "scan": scan, "remat": args.remat,
           "attn": attention or "auto", "conv": args.conv or "auto", "nha": args.nha or "auto",
           "data": ("text" if args.data else "synthetic") if packed else "random, unpacked"}
    try:
        built = build_step(name, length, tokens=args.tokens, data=args.data, remat=args.remat,
                           scan=scan, packed=packed, attention=attention, conv=args.conv,
                           nha=args.nha, modes=args.oryx_modes)
        row.update(built.info)
        state, step, batches = built.state, built.step, built.batches
        for i in range(2):
            state, metrics = step(state, batches[i % 4])
        jax.block_until_ready(metrics)
        steps = steps or args.steps
        start = time.perf_counter()
        for i in range(steps):
            state, metrics = step(state, batches[i % 4])
        loss = float(metrics["loss"])
        seconds = (time.perf_counter() - start) / steps
        row.update(step_ms=seconds * 1e3, tokens_per_s=batch * length / seconds, loss=loss,
                   **flops_columns(built.config, built.host, seconds, args.peak,
                                   args.matmul_tflops, built.params, args.oryx_modes))
    except Exception as e:  # noqa: BLE001  (out of memory and the like: report, go on)
        row["error"] = error_text(e)
    print(json.dumps(row), flush=True)
    return row


def _memory_gib(compiled) -> float:
    memory = compiled.memory_analysis()
    return (memory.argument_size_in_bytes + memory.temp_size_in_bytes) / 2**30


def _device_gib() -> float:
    stats = jax.devices()[0].memory_stats() or {}
    return stats.get("bytes_limit", 2**62) / 2**30


def torch_mismatch(config: ModelConfig) -> str:
    """What of `config` the PyTorch peer (`peers/torch_gpt.py`: multi-head causal attention
    with full RoPE, SwiGLU, tied embeddings, no biases) does not build; "" when nothing."""
    kinds = sorted({spec.type for spec in config.layers} - {"attention"})
    wrong = [f"{kind} layers" for kind in kinds]
    if any(spec.options for spec in config.layers if spec.type == "attention"):
        wrong.append("attention layer options")
    for field, value in (("num_kv_heads", config.num_heads), ("head_dim",
                         config.d_model // config.num_heads)):
        if getattr(config, field) not in (None, value):
            wrong.append(f"{field}={getattr(config, field)}")
    for field, value in (("window", None), ("tie_embeddings", True), ("qkv_bias", False),
                         ("position_embedding", "none"), ("rope_fraction", 1.0),
                         ("rope_scaling", None)):
        if getattr(config, field) != value:
            wrong.append(f"{field}={getattr(config, field)!r}")
    if not config.resolved_ffn_dim:
        wrong.append("no FFN")
    return ", ".join(wrong)


def torch_peer(name: str, length: int, args) -> dict:
    config = model_config(name)
    batch = max(args.tokens // length, 1)
    mismatch = torch_mismatch(config)
    if mismatch:  # it would time another model under this name
        row = {"model": name, "T": length, "B": batch, "data": "random (torch)",
               "impl": "torch", "error": f"torch peer not run: it builds no {mismatch}"}
        print(json.dumps(row), flush=True)
        return row
    command = [sys.executable, "-m", "experiments.benchmarks.peers.torch_gpt",
               "--layers", str(len(config.layers)), "--d-model", str(config.d_model),
               "--heads", str(config.num_heads), "--ffn", str(config.resolved_ffn_dim),
               "--vocab", str(VOCAB), "--batch", str(batch), "--length", str(length),
               "--steps", str(args.steps)]
    row = {"model": name, "T": length, "B": batch, "data": "random (torch)", "impl": "torch"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    except subprocess.TimeoutExpired as e:  # the JAX rows still run
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        row["error"] = f"torch peer timed out after {e.timeout:g} s: " + (stderr or "")[-300:]
        print(json.dumps(row), flush=True)
        return row
    try:
        peer = json.loads(done.stdout.strip().splitlines()[-1])
        row.update(impl="torch", compile_s=peer["compile_s"], step_ms=peer["step_ms"],
                   tokens_per_s=peer["tokens_per_s"], mem_GiB=peer["peak_GiB"])
    except (IndexError, json.JSONDecodeError, KeyError):
        row["error"] = "torch peer failed: " + done.stderr[-300:]
    print(json.dumps(row), flush=True)
    return row


def add_ratios(rows: list[dict], baseline: str) -> None:
    """Sets `vs_base` (tokens/s over `baseline`'s row at the same T, data, scan and remat, on
    the automatic attention, conv and NHA rungs) and `vs_torch` (over the PyTorch peer's row of the
    same model and T) on every timed JAX row that has one."""
    setting = lambda r: (r["T"], r["data"], r.get("scan"), r.get("remat"))  # noqa: E731
    timed = [r for r in rows if "tokens_per_s" in r]
    base = {setting(r): r["tokens_per_s"] for r in timed if r["model"] == baseline
            and r.get("impl", "jax") == "jax" and r.get("attn") == "auto"
            and r.get("conv") == "auto" and r.get("nha", "auto") == "auto"}
    torch = {(r["model"], r["T"]): r["tokens_per_s"] for r in timed if r.get("impl") == "torch"}
    for row in timed:
        if row.get("impl", "jax") != "jax":
            continue
        if setting(row) in base:
            row["vs_base"] = row["tokens_per_s"] / base[setting(row)]
        if (row["model"], row["T"]) in torch:
            row["vs_torch"] = row["tokens_per_s"] / torch[row["model"], row["T"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--data", default="")
    parser.add_argument("--models", default=",".join(
        ["transformer-125m", "transformer-350m", "gdn-340m", "mamba2-130m", "nha-340m",
         "nha-hybrid-340m"]))
    parser.add_argument("--lengths", default="2048,8192,32768")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--scan", action=argparse.BooleanOptionalAction, default=False,
                        help="scan the layers (default: unscanned, the library's default and "
                             "the faster form on one GPU: BENCHMARKS.md, session 9)")
    parser.add_argument("--remat", default="none")
    parser.add_argument("--unpacked", default="transformer-125m")
    parser.add_argument("--torch", default="transformer-125m")
    parser.add_argument("--compile-check", default="")
    parser.add_argument("--ablate", default="", help="models to rerun at the first length with "
                        "attention forced: pallas unpacked, xla packed (the kernel's share)")
    parser.add_argument("--unscanned", default="", help="models to rerun at the first length "
                        "unscanned on unpacked random tokens (cuDNN, so the compile is short): "
                        "the layer scan's cost")
    parser.add_argument("--conv", default=None,
                        help="force an ops.short_conv rung in every layer that has short convs")
    parser.add_argument("--nha", default=None,
                        help="force an ops.native_hybrid_attention rung in the full-window NHA "
                             "layers (e.g. 'attention': causal attention of the window branch)")
    parser.add_argument("--oryx-modes", default="random_chunks",
                        help="the Oryx models' training mode schedule (a ModeSchedule pattern: "
                             "random_chunks, attention, linear or none)")
    parser.add_argument("--matmul-size", type=int, default=8192)
    parser.add_argument("--time-limit", type=float, default=1e9, help="seconds; skip the rest")
    parser.add_argument("--baseline", default="",
                        help="the model of the vs_base column (default: the first of --models)")
    parser.add_argument("--kernel-changes", type=parse_kernel_changes, default={},
                        help="KERNEL:FIELD=VALUE,...;...: the kernels' default tiles changed "
                             "in every JAX row (e.g. 'ssd:grads_num_stages=2')")
    parser.add_argument("--out", default="train_throughput.json")
    args = parser.parse_args(argv)
    with changed_kernel_defaults(args.kernel_changes):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    lengths = [int(x) for x in args.lengths.split(",")]
    split = lambda s: [x for x in s.split(",") if x]
    start, rows = time.perf_counter(), []
    over = lambda: time.perf_counter() - start > args.time_limit
    if args.data:  # before the peers' minutes: every packed row would refuse it
        check_vocabulary(args.data, VOCAB)
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
    for name in split(args.unscanned):
        if not over():
            rows.append(run_one(name, lengths[0], args, packed=False, scan=False))
    for row in rows:
        row.setdefault("impl", "jax")
    add_ratios(rows, args.baseline or (split(args.models) or [""])[0])
    print_table(rows, ["model", "impl", "T", "B", "data", "attn", "modes", "scan", "remat",
                       "tokens_per_s",
                       "vs_base", "vs_torch", "tflops", "mfu_6n", "mfu_6n_matmul", "mfu_model",
                       "mfu_model_matmul", "uncounted", "mem_GiB", "compile_s", "docs_per_row",
                       "error"])
    write_json(args.out, "train_throughput", rows, matmul_tflops=args.matmul_tflops,
               matmul_size=args.matmul_size,
               peak_tflops=(args.peak or 0) / 1e12, tokens_per_step=args.tokens,
               command=" ".join(sys.argv), xla_flags=os.environ.get("XLA_FLAGS", ""),
               kernel_changes=args.kernel_changes)
    return 0


if __name__ == "__main__":
    sys.exit(run_with_logging(main))
