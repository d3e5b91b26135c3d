#!/bin/bash
# Session 19, call c: the new defaults in the model. nha-340m and nha-hybrid-340m (D 256: every
# slot kernel over feature tiles of 64 at 4 warps, from s19a) against transformer-350m on
# packed WikiText-2 at T 8192, the same call; and the NHA slot feature tiles at D 128
# (issue 15's shape, H16 w512, with documents), where they are not the default.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
train() {  # model, seconds
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/train_$1.json >> $OUT/train.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/train.log | grep "^$1\|^model" | tail -2 | cut -c1-250
}
train transformer-350m 90
train nha-340m 150
train nha-hybrid-340m 150
timeout 120 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --window 512 --documents 1500 --top 12 --variants 'slot features tiled' \
    --out /tmp/j/op_kernels_nha128.json > $OUT/op_kernels_nha128.log 2>&1
echo "nha128 op_kernels rc=$?"; filt $OUT/op_kernels_nha128.log | grep "ms of kernels\|Error" | cut -c1-140
