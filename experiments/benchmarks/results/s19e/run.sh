#!/bin/bash
# Session 19, call e: three helpers' default-off options (CPU ptxas audits), timed against
# today's defaults in the same run, then checked, then in the model where one wins:
# SSD at mamba2-340m's P 64 (state_grads in [64, 64] state tiles; chunk_grads at 16 warps),
# NHA at nha-340m's D 256 (the window dk/dv kernel key-major, 3 stages, 128 query rows),
# GDN's forward at K = V = 128 (chunk_prepare's loads first; issue 15's forward target).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
HERE=experiments/benchmarks/results/s19e
left() { echo $((540 - SECONDS)); }
timeout 90 python3 -m experiments.benchmarks.op_kernels --ops ssd --shape mamba2-340m@4x8192 \
    --documents 1500 --top 6 --variants 'default, grads summed scores;default, state grads 64 columns;default, state grads 64 columns 8 warps;default, grads 16 warps;default, grads 16 warps, state grads 64 columns' \
    --out /tmp/j/op_kernels_ssd.json > $OUT/op_kernels_ssd.log 2>&1
echo "ssd op_kernels rc=$?"; filt $OUT/op_kernels_ssd.log | grep "ms of kernels\|ssd_state_grads\|ssd_chunk_grads\|Error" | cut -c1-150
SSD=$(python3 $HERE/pick.py /tmp/j/op_kernels_ssd.json 'fwd+bwd pallas (default, grads summed scores)' \
    'default, state grads 64 columns=ssd:backward_block_n=64' \
    'default, state grads 64 columns 8 warps=ssd:backward_block_n=64,backward_num_warps=8' \
    'default, grads 16 warps=ssd:grads_num_warps=16' \
    'default, grads 16 warps, state grads 64 columns=ssd:grads_num_warps=16,backward_block_n=64')
echo "ssd pick: '$SSD'"
timeout 100 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape nha-340m@4x8192 --window 32 --documents 1500 --top 8 \
    --variants 'window keys transposed;window keys transposed s3;window q128;window tiles s19' \
    --out /tmp/j/op_kernels_nha.json > $OUT/op_kernels_nha.log 2>&1
echo "nha op_kernels rc=$?"; filt $OUT/op_kernels_nha.log | grep "ms of kernels\|nha_backward_window_keys\|Error" | cut -c1-150
NHA=$(python3 $HERE/pick.py /tmp/j/op_kernels_nha.json 'fwd+bwd' \
    'window keys transposed=nha:window_keys_transposed=True' \
    'window keys transposed s3=nha:window_keys_transposed=True,backward_num_stages=3' \
    'window q128=nha:block_q=128' \
    'window tiles s19=nha:window_keys_transposed=True,backward_num_stages=3,block_q=128')
echo "nha pick: '$NHA'"
timeout 100 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --shapes 4x8192 --no-fla --variants 'prepare loads first;prepare TF32 merges;prepare loads first, exact merges' \
    --out /tmp/j/gdn_table.json > $OUT/gdn_table.log 2>&1
echo "gdn table rc=$?"; filt $OUT/gdn_table.log | grep -v "^{" | cut -c1-160 | tail -6
if [ -n "$SSD" ]; then
  timeout 70 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
      --check-changes "${SSD#ssd:}" --out /tmp/j/ssd_check.json > $OUT/ssd_check.log 2>&1
  echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | cut -c1-200 | tail -7
fi
if [ -n "$NHA" ] && [ $(left) -gt 300 ]; then
  timeout 120 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer \
      --check-variants slot_features_tiled_split_w8 --check-changes "${NHA#nha:}" \
      --out /tmp/j/nha_check.json > $OUT/nha_check.log 2>&1
  echo "nha check rc=$?"; filt $OUT/nha_check.log | grep -v "^{" | cut -c1-200 | tail -9
fi
train() {  # model, seconds, label, kernel changes
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --kernel-changes "$4" --out /tmp/j/train_$1_$3.json >> $OUT/train.log 2>&1
  echo "train $1 $3 rc=$?"; filt $OUT/train.log | grep "^$1\|^model" | tail -1 | cut -c1-200
}
for pair in "mamba2-340m:$SSD" "nha-340m:$NHA"; do
  model=${pair%%:*}; changes=${pair#*:}
  if [ -n "$changes" ] && [ $(left) -gt 250 ]; then
    train $model 125 changed "$changes"; train $model 125 default ""
  fi
done
echo "done at ${SECONDS} s"
