#!/bin/bash
# Session 21, call e (cold): D 256 packed flash attention (nha-hybrid-340m's four full-attention
# layers: B4 T8192 H4) 1) swept on documents as long as WikiText-2's (log-normal, median 2166:
# the packed file's mean of 3,571 tokens at σ 1), then 2) nha-hybrid-340m on packed WikiText-2 at
# T 8192 with the sweep's fastest tiles (`--kernel-changes`) and with today's, same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 230 python3 -m experiments.benchmarks.flash_attention --parts sweep --shapes d256 \
    --doc-median 2166 --sweep-seconds 170 --out $OUT/fa_sweep.json > $OUT/fa_sweep.log 2>&1
echo "sweep rc=$?"; filt $OUT/fa_sweep.log | grep -v "^{" | tail -45 | cut -c1-200
changes=$(python3 - "$OUT/fa_sweep.json" <<'PY'
import json, sys
from pallas_kernels.flash_attention.block_sizes import BlockSizes, default_block_sizes
best = BlockSizes(**json.load(open(sys.argv[1]))["best"]["d256"]["blocks"])
today = default_block_sizes(256)
print(",".join(f"{k}={v}" for k, v in vars(best).items() if getattr(today, k) != v))
PY
)
echo "changes: $changes"
train() {  # out name, extra args
  timeout 240 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models nha-hybrid-340m --torch "" --unpacked "" --steps 4 --remat none \
      --out $OUT/$1.json "${@:2}" > $OUT/$1.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/$1.log | grep -v "^{" | tail -3 | cut -c1-200
}
if [ -n "$changes" ]; then train hybrid_swept --kernel-changes "flash_attention:$changes"; fi
train hybrid_today
