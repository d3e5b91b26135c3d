#!/bin/bash
# Session 22, call e: NHA at nha-340m's layer (B4 T8192 H4 D256 w32, packed documents) with
# chunks of 32 (w one chunk: no delayed copies of k, v, s, g) against today's 64; the GPU check
# with chunk=32 in every case.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape nha-340m@4x8192 --window 32 --documents 1500 --top 16 --variants 'chunk 32' \
    --out $OUT/op_kernels_nha340m.json > $OUT/op_kernels_nha340m.log 2>&1
echo "op_kernels rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/op_kernels_nha340m.log | cut -c1-150 | head -80
timeout 230 python3 -m experiments.benchmarks.nha_kernel --parts check --no-peer \
    --check-changes chunk=32 --out $OUT/nha_check_c32.json > $OUT/nha_check_c32.log 2>&1
echo "check rc=$?"; grep -v "^{\|^W12\|^I12" $OUT/nha_check_c32.log | cut -c1-200 | tail -24
