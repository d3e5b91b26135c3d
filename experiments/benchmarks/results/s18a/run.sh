#!/bin/bash
# Session 18, call a: the GPU check of GDN's 'forward V64 4 stages' (now with a K = V = 64 case,
# oryx-gdn-340m's heads), and where the steps of transformer-125m (the 45 % MFU target),
# nha-340m (its D 256 kernel gain that did not show) and mamba2-340m go today.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 110 python3 -m experiments.benchmarks.delta_rule_kernel --check \
    --variant 'forward V64 4 stages' --budget-s 100 --out /tmp/j/gdn_check.json > $OUT/gdn_check.log 2>&1
echo "gdn check rc=$?"; filt $OUT/gdn_check.log | grep -v "^{" | cut -c1-200 | tail -9
profile() {  # model, length, tokens, seconds
  timeout $4 python3 -m experiments.benchmarks.profile_step --model $1 --length $2 \
      --tokens $3 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none \
      --top 40 --out /tmp/j/profile_$1.json > $OUT/profile_$1.log 2>&1
  echo "profile $1 rc=$?"; filt $OUT/profile_$1.log | grep -A8 "^category" | head -9
}
profile transformer-125m 2048 32768 80
profile nha-340m 8192 32768 140
profile mamba2-340m 8192 32768 170
