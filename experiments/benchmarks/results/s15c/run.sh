#!/bin/bash
# Session 15, call c: with today's defaults (short-conv streaming backward, Pallas norms, SSD
# vectors in step, GDN TF32 merges for a forward alone at K 128): the GDN and SSD tables against
# fla with the helpers' new labels (GDN Round 20, SSD round 8) and their GPU checks; the
# short-conv table against the XLA rung; the other 340M hybrids on packed WikiText-2 at T 8192; the
# 125M transformer against the PyTorch peer at T 2048. From the repo root, carrying .whl, .gpu
# and .devdata/wikitext2_bpe32k.npz.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla /tmp/j && tar xzf .gpu/triton_fla.tgz -C /tmp
trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
VARIANTS="${VARIANTS:-none}"  # the helpers' labels, ';'-separated
timeout 130 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule,ssd \
    --impls pallas --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 60 \
    --fla-runs 2 --time-limit 125 --variants "$VARIANTS" \
    --out /tmp/j/table.json > $OUT/kernels.log 2>&1
echo "table rc=$?"; filt $OUT/kernels.log | grep "^gated\|^ssd\|^attention\|^op \|^target" | cut -c1-130
if [ -n "$GDN_CHECK" ]; then
  timeout 75 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 60 \
      --variant "$GDN_CHECK" --out /tmp/j/gdn_check.json >> $OUT/kernels.log 2>&1
  echo "gdn check rc=$?"; filt $OUT/kernels.log | grep "check: \|  True\|  False" | cut -c1-190 | tail -6
fi
timeout 55 python3 -m experiments.benchmarks.short_conv --parts table --channels 768,1536 \
    --budget-s 45 --out /tmp/j/short_conv.json > $OUT/short_conv.log 2>&1
echo "short_conv rc=$?"; filt $OUT/short_conv.log | grep -v "^{" | cut -c1-160 | tail -10
timeout 110 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 2048 --models transformer-125m --torch transformer-125m --unpacked transformer-125m \
    --steps 6 --time-limit 105 --out /tmp/j/train_125m.json > $OUT/train.log 2>&1
echo "train 125m rc=$?"; filt $OUT/train.log | grep "^transformer\|^model" | cut -c1-250
# transformer-350m and gdn-340m: call b, the same code for both
timeout 230 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models mamba2-340m,nha-340m,nha-hybrid-340m --torch "" \
    --unpacked "" --steps 4 --remat none --time-limit 225 \
    --out /tmp/j/train_wikitext_8192.json >> $OUT/train.log 2>&1
echo "train 8192 rc=$?"; filt $OUT/train.log | grep "^transformer-350\|^gdn\|^mamba\|^nha\|^model" | cut -c1-250
