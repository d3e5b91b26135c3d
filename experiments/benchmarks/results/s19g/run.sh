#!/bin/bash
# Session 19, call g (cold, short): the NHA window kernels' session-19 options at D 128
# (issue 15's B4 T8192 H16 w512 with packed documents), where D 256 took all three.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 150 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --window 512 --documents 1500 --top 8 \
    --variants 'window keys transposed;window keys transposed s3;window tiles s19' \
    --out $OUT/op_kernels_nha128.json > $OUT/op_kernels_nha128.log 2>&1
echo "rc=$?"; grep "ms of kernels\|nha_backward_window_keys\|nha_window\|Error" $OUT/op_kernels_nha128.log | cut -c1-150
