#!/bin/bash
# Session 20, call a (cold): session 19's race fix, BlockSizes.slot_pairs_own_tiles (nha/NOTES.md,
# "The race"). 1) the NHA check with the flag on (API rows in the default form and the two forms
# refused without it; the op rows run the defaults with the flag), 2) its cost and that of the
# 8-warp forms it would allow, on nha-340m's layer and at D 128 w 512 (API refusal off there).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer --allow-unchecked-tiles \
    --check-variants slot_features_tiled_split_w4,slot_features_tiled_split_w8,slot_features_tiled_unsplit \
    --check-changes slot_pairs_own_tiles=True --out $OUT/nha_check_own.json > $OUT/nha_check_own.log 2>&1
echo "check rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/nha_check_own.log | cut -c1-200 | tail -14
timeout 150 python3 experiments/benchmarks/results/s20a/unrefused.py --ops native_hybrid_attention --shape nha-340m@4x8192 --window 32 --documents 1500 --top 14 \
    --variants 'slot pairs own tiles;slot pairs own tiles bwd w8;slot pairs own tiles unsplit w8' \
    --out $OUT/op_kernels_nha340m.json > $OUT/op_kernels_nha340m.log 2>&1
echo "nha340m rc=$?"; grep "ms of kernels\|Error" $OUT/op_kernels_nha340m.log | cut -c1-150
timeout 120 python3 experiments/benchmarks/results/s20a/unrefused.py --ops native_hybrid_attention --shape 4x8192 --window 512 --documents 1500 --top 14 \
    --variants 'slot pairs own tiles;slot pairs own tiles bwd w8' \
    --out $OUT/op_kernels_nha128.json > $OUT/op_kernels_nha128.log 2>&1
echo "nha128 rc=$?"; grep "ms of kernels\|Error" $OUT/op_kernels_nha128.log | cut -c1-150
