#!/bin/bash
# Session 20, call g (cold): 1) the GDN check with `prepare_loads_first` in the K 128 forward-alone
# default (its `out_primal` column); 2) the helper's NHA `slot_readout_o_first` against the
# default, fwd+bwd kernels at D 128 (w 512) and nha-340m's layer, and its NHA check when it wins;
# 3) transformer-350m and nha-340m on packed WikiText-2 at T 8192 with RoPE's new backward.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 100 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
    --out $OUT/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | tail -8 | cut -c1-200
for s in "4x8192 512" "nha-340m@4x8192 32"; do set -- $s; n=${1/@/_}
  timeout 100 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention --shape $1 \
      --window $2 --documents 1500 --top 14 --variants 'slot readout o first' \
      --out $OUT/nha_$n.json > $OUT/nha_$n.log 2>&1
  echo "nha $1 rc=$?"; grep "ms of kernels\|nha_slot_readout_add" $OUT/nha_$n.log | cut -c1-120
done
win=$(python3 - "$OUT/nha_4x8192.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
total = lambda p: sum(r["ms"] for r in rows if r.get("pass") == p and "ms" in r)
print(int(total("fwd+bwd pallas (slot readout o first)") < 0.995 * total("fwd+bwd")))
PY
)
echo "option wins at D 128: $win"
if [ "$win" = 1 ]; then
  timeout 150 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer --check-variants default \
      --check-changes slot_readout_o_first=True --out $OUT/nha_check.json > $OUT/nha_check.log 2>&1
  echo "nha check rc=$?"; filt $OUT/nha_check.log | grep -v "^{" | tail -9 | cut -c1-120
fi
timeout 210 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,nha-340m --torch "" --unpacked "" --steps 4 --remat none \
    --out $OUT/train.json > $OUT/train.log 2>&1
echo "train rc=$?"; filt $OUT/train.log | grep -v "^{" | tail -6 | cut -c1-200
# Follow-up on the warm machine (its outputs: out/train_hybrid.*):
#   timeout 220 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
#       --lengths 8192 --models nha-hybrid-340m --torch "" --unpacked "" --steps 4 --remat none
# (The NHA check above failed before any kernel: its API check's variant `default` is
# `BlockSizes()`, which has no feature tiles, and the option requires them.)
