#!/bin/bash
# Session 12, call f (issue 15): GDN Rounds 11-12 (NOTES.md): the V slices share q and k
# through the kernels' index maps (no repeat), the output kernel's V tile, the forward state
# pass's state as row blocks of 64 keys each stored first (a helper's ptxas analysis: no
# spills at V 64, 4 warps); the GPU check with a V = 512 case (two slices). fla's forward in
# the same run.
# From the repo root, carrying .whl and .gpu.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/triton_fla && tar xzf .gpu/triton_fla.tgz -C /tmp
timeout 90 python3 -m experiments.benchmarks.delta_rule_kernel --check --budget-s 75 \
    --out $OUT/check.json > $OUT/check.log 2>&1
echo "check rc=$?"; filt $OUT/check.log | grep -v "^{" | cut -c1-190 | tail -7
timeout 135 python3 -m experiments.benchmarks.linear_ops --parts table --ops gated_delta_rule \
    --impls pallas --variants 'outputs V128;outputs V64;forward V64 key blocks;forward V64 key blocks 2 stages;forward key blocks' --shapes gdn-340m@4x8192 \
    --fla-cache /tmp/triton_fla --fla-timeout 30 --time-limit 125 --out $OUT/k256.json \
    > $OUT/k256.log 2>&1
echo "k256 rc=$?"; filt $OUT/k256.log | grep "^gated\|^op " | cut -c1-150
