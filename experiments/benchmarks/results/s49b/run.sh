#!/bin/bash
# Session 49: op_kernels with kernel_traffic's columns on a GPU (the trace's kernel names joined
# with the pallas_calls' two numbers): GDN and SSD at B4 T8192 H16 K=V=128 bf16. Carry .whl.
export OUT=$OUT/s49b; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 240 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule,ssd --shape 4x8192 \
    --top 8 --out $OUT/op_kernels.json > $OUT/op_kernels.log 2>&1
echo "rc=$?"; grep -v "^W12\|^I12" $OUT/op_kernels.log | grep -A 12 "against their two numbers" | cut -c1-160
