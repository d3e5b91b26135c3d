#!/bin/bash
# Session 21, call g (cold): the short conv's streaming forward (`stream_forward`, default off):
# 1) check and each kernel alone at C 768 / 1536 (gdn-340m) and 2048 (mamba2-340m's x conv),
# packed and one document a row; 2) mamba2-340m on packed WikiText-2 at T 8192 with the label
# whose forward summed over those rows is fastest (`--kernel-changes`), and without, same call.
# (The option and the labels are in commit 6908c2d; removed after this call, NOTES.md.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 200 python3 -m experiments.benchmarks.short_conv --parts check,variants --channels 768,1536,2048 \
    --variants 'stream fwd,stream fwd u4,stream fwd s16,stream fwd c256,stream fwd 2w' --budget-s 170 \
    --out $OUT/short_conv.json > $OUT/short_conv.log 2>&1
echo "short_conv rc=$?"; filt $OUT/short_conv.log | grep -v "^{" | tail -42 | cut -c1-160
changes=$(python3 - "$OUT/short_conv.json" <<'PY'
import json, sys
from experiments.benchmarks.short_conv import VARIANTS
data = json.load(open(sys.argv[1]))
rows = data["variants"]
total = {}
for r in rows:
    if "fwd_ms" in r:
        total.setdefault(r["variant"], []).append(r["fwd_ms"])
n = max(len(v) for v in total.values())
full = {k: sum(v) for k, v in total.items() if len(v) == n}
best = min(full, key=full.get)
print(f"# forward summed: {full}", file=sys.stderr)
if best != "default" and full[best] < 0.97 * full["default"]:
    print(",".join(f"{k}={v}" for k, v in VARIANTS[best].changed().items()))
PY
)
echo "changes: $changes"
train() {  # out name, extra args
  timeout 200 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models mamba2-340m --torch "" --unpacked "" --steps 4 --remat none \
      --out $OUT/$1.json "${@:2}" > $OUT/$1.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/$1.log | grep -v "^{" | tail -2 | cut -c1-200
}
if [ -n "$changes" ]; then train mamba2_stream --kernel-changes "short_conv:$changes"; train mamba2_today; fi
