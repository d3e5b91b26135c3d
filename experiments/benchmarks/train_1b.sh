#!/bin/bash
# The ~1B presets (nha-hybrid-1b, transformer-1b; issue 18) for a few training steps through
# the trainer's step, timed by `hybrid-jax scale` (random tokens, no data files). Run from the
# repo root; writes to $OUT (default ./runs/train_1b). Two parts, each one command:
#
#   bash experiments/benchmarks/train_1b.sh gpu   # one GPU, <= 120 s
#       both presets, bf16 compute (float32 parameters and AdamW state), layer scan, remat full,
#       batch 4 of T 2048: train/forward tokens/s, MFU, peak memory, compile time
#       -> $OUT/gpu/scale.{json,md,png}
#   bash experiments/benchmarks/train_1b.sh cpu   # 8 fake CPU devices, fsdp 8, <= 150 s
#       nha-hybrid-1b at full depth with its parameters and AdamW state sharded 8 ways (float32,
#       scan, remat full, batch 8 of T 128): a plumbing run on a host with >= 64 GB, whose
#       peak_mb_per_device shows the sharding (22 GB of parameters, gradients and moments / 8)
#       -> $OUT/cpu_fsdp8/scale.{json,md}
#
# Both print a Markdown table (BENCHMARKS.md). A preset not reached within --time-limit is
# printed as skipped.
set -u
PART=${1:?usage: train_1b.sh gpu|cpu}
OUT=${OUT:-runs/train_1b}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
TRAIN="--set model.remat=full --set model.scan_layers=true"
case "$PART" in
  gpu)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
    timeout 115 python3 -m experiments.cli scale mqar-hybrid-tiny --devices 1 --strategy fsdp \
        --model nha-hybrid-1b,transformer-1b --steps 3 --time-limit 60 $TRAIN \
        --set model.dtype=bfloat16 --set train.batch_size=4 --set data.seq_len=2048 \
        --out "$OUT/gpu" 2>&1 | grep -v "^W[0-9]\{4\}"
    ;;
  cpu)
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 \
    timeout 145 python3 -m experiments.cli scale mqar-hybrid-tiny --devices 8 --strategy fsdp \
        --model nha-hybrid-1b --steps 1 $TRAIN --set train.batch_size=8 --set data.seq_len=128 \
        --out "$OUT/cpu_fsdp8" 2>&1 | grep -v "^W[0-9]\{4\}"
    ;;
  *) echo "train_1b.sh: expected 'gpu' or 'cpu', got '$PART'" >&2; exit 2 ;;
esac
echo "train_1b $PART rc=${PIPESTATUS[0]}"
