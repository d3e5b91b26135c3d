#!/bin/bash
# Session 17, call b: GDN and NHA kernels with packed documents (op_kernels --documents 1500:
# log-normal lengths, mean ≈ 2.5k tokens, as WikiText-2's rows), at gdn-340m's and nha-340m's
# layer shapes: GDN's reverse pass in flight (the default above K 128) against the pass before
# it; NHA D 256's slot backward split at 4 warps, with and without tiled slot inputs, against
# its default (unsplit, 8 warps). Then the Gutenberg books at T 8192 (session 10's table):
# transformer-350m, nha-hybrid-340m (the attention rung automatic), oryx-gdn-340m.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
timeout 70 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule \
    --shape gdn-340m@4x8192 --documents 1500 --variants 'reverse not in flight' --top 8 \
    --out /tmp/j/op_kernels_gdn.json > $OUT/op_kernels_gdn.log 2>&1
echo "gdn op_kernels rc=$?"; filt $OUT/op_kernels_gdn.log | grep "ms of kernels\|^gated_delta_rule_chunk_\|Error" | cut -c1-120
timeout 120 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape nha-340m@4x8192 --window 32 --documents 1500 --top 14 \
    --variants 'slot backward split w4;slot backward split w4 inputs tiled' \
    --out /tmp/j/op_kernels_nha.json > $OUT/op_kernels_nha.log 2>&1
echo "nha op_kernels rc=$?"; filt $OUT/op_kernels_nha.log | grep "ms of kernels\|^nha_\|Error" | cut -c1-120
train() {  # model, seconds
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/gutenberg00_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/books_$1.json >> $OUT/books.log 2>&1
  echo "books $1 rc=$?"; filt $OUT/books.log | grep "^$1\|^model" | tail -2 | cut -c1-250
}
train transformer-350m 100
train nha-hybrid-340m 130
train oryx-gdn-340m 120
