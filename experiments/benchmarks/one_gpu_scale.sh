#!/bin/bash
# Issue 18 on one GPU, ~6 minutes in all (each part under a hard timeout; run from the repo root,
# writes to $OUT, default ./runs/one_gpu_scale):
#  (a) the one-device `hybrid-jax scale` table: the data strategy on 1 device for
#      transformer-350m, gdn-340m and nha-hybrid-340m (bf16, remat full, layer scan; batch 4 of
#      T 2048, random tokens): train and forward tokens/s, per-device TFLOP/s (hybrid_jax.flops),
#      MFU, peak memory per device, compile time -> $OUT/scale/scale.{json,md,png};
#  (b) long context, no context parallelism: the largest T that trains for nha-340m, gdn-340m
#      and transformer-350m (bf16, remat full, batch 1) and tokens/s at T = 8k/32k/128k
#      -> $OUT/long_context.json; what it could not probe in time is printed.
# Both print Markdown tables for BENCHMARKS.md. No data files are needed (random tokens).
set -u
OUT=${OUT:-runs/one_gpu_scale}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
timeout 170 python3 -m experiments.cli scale mqar-hybrid-tiny --devices 1 --strategy data \
    --model transformer-350m,gdn-340m,nha-hybrid-340m --steps 2 --time-limit 100 \
    --set model.dtype=bfloat16 --set model.remat=full --set model.scan_layers=true \
    --set train.batch_size=4 --set data.seq_len=2048 --out "$OUT/scale" 2>&1 \
    | grep -v "^W[0-9]\{4\}"
echo "scale rc=${PIPESTATUS[0]}"
timeout 185 python3 -m experiments.benchmarks.long_context \
    --models transformer-350m,gdn-340m,nha-340m --lengths 8192,32768,131072 \
    --max-length 1048576 --probe-limit 45 --budget 160 --out "$OUT/long_context.json" 2>&1 \
    | grep -v "^W[0-9]\{4\}"
echo "long_context rc=${PIPESTATUS[0]}"
