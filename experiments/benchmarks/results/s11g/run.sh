#!/bin/bash
# Session 11, call g (issue 15): GDN Round 9, the state-only pass's state carried as row
# blocks of 64 keys (`state_key_block`), as fla's state kernel (2x faster than ours, call f)
# does; at gdn-340m's K 256 and at K 128, fla's forward in the same run (call b's cache); then
# the GPU accuracy check with the blocks.  From the repo root, carrying .whl and .gpu.
# (The state_key_block option, its variant labels and --state-key-block were removed after this call: no gain, NOTES.md Round 9.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 190 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'key blocks 64;key blocks 64 4 warps;key blocks 64 V64 4 warps' \
    --shapes gdn-340m@4x8192,4x8192 --fla-cache /tmp/triton_fla --fla-timeout 40 --time-limit 180 \
    --out $OUT/key_blocks.json > $OUT/key_blocks.log 2>&1
echo "rc=$?"
filt $OUT/key_blocks.log | grep -v "^{" | cut -c1-140 | tail -16
timeout 100 python3 -m experiments.benchmarks.delta_rule_kernel --check --state-key-block 64 \
    --budget-s 80 --out $OUT/key_blocks_check.json > $OUT/key_blocks_check.log 2>&1
echo "check rc=$?"
filt $OUT/key_blocks_check.log | grep -v "^{" | cut -c1-160 | tail -8
