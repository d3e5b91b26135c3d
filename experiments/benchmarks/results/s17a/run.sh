#!/bin/bash
# Session 17, call a: nha-hybrid-340m on packed WikiText-2 at T 8192 with its full-window layers
# on the NHA op's 'attention' rung (--nha attention) and on the default (pallas, document
# bounds); mamba2-340m after session 16's norm change; gdn-340m's step profile after session
# 16's GDN defaults. From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
train() {  # model, seconds, label, extra flags
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/train_$1_$3.json $4 >> $OUT/train_$3.log 2>&1
  echo "train $1 $3 rc=$?"; filt $OUT/train_$3.log | grep "^$1\|^model" | tail -2 | cut -c1-250
  grep -i "rung\|fall" $OUT/train_$3.log | sort | uniq -c | head -5 | cut -c1-250
}
train nha-hybrid-340m 135 attention "--nha attention"
train mamba2-340m 135 default ""
timeout 140 python3 -m experiments.benchmarks.profile_step --model gdn-340m --length 8192 \
    --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
    --top 30 --out /tmp/j/profile_gdn-340m.json > $OUT/profile_gdn-340m.log 2>&1
echo "profile gdn rc=$?"; filt $OUT/profile_gdn-340m.log | grep -A12 "^category" | head -14
train nha-hybrid-340m 130 default ""
