#!/bin/bash
# Session 17, call d: SSD's D skip with dD as one XLA reduction (call c's whole-tile sum in
# chunk_grads' head loop cost mamba2-340m 126,003 -> 120,397 tokens/s): the GPU check (with D,
# bf16-representable cotangents) and mamba2-340m on packed WikiText-2 at T 8192.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 80 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-190 | tail -6
timeout 140 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models mamba2-340m --torch "" --unpacked "" --steps 4 --remat none \
    --time-limit 135 --out /tmp/j/train_mamba2-340m.json > $OUT/train.log 2>&1
echo "train rc=$?"; filt $OUT/train.log | grep "^mamba2\|^model" | tail -2 | cut -c1-250
