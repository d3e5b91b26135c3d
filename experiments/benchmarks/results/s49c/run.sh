#!/bin/bash
# Session 49 (an H100 came, asked for as nvidia-h200; warm after s49b): this session's CPU tests
# under the device's JAX (0.11.2; CI pins 0.10.2) on its CPU with 8 fake devices, the NHA GQA
# partitioner probe there, then op_kernels of NHA with kernel_traffic's columns. Carry .whl.
export OUT=$OUT/s49c; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import pytest, xdist" 2>/dev/null && N="-n 8" || N=""
echo "pytest args: $N"
JAX_PLATFORMS=cpu timeout 200 python3 -m pytest -q $N -p no:cacheprovider \
    tests/ops/test_explicit_axes_ops.py tests/test_explicit_axes.py \
    tests/benchmarks/test_kernel_traffic.py > $OUT/cpu_tests.log 2>&1
echo "tests rc=$?"; tail -5 $OUT/cpu_tests.log | cut -c1-200
JAX_PLATFORMS=cpu timeout 100 python3 experiments/benchmarks/results/s49c/nha_gqa_explicit.py \
    2>&1 | grep -v "^W12\|^I12" | tail -4 | tee $OUT/nha_gqa.log
timeout 200 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --documents 1500 --top 4 --out $OUT/op_kernels_nha.json > $OUT/op_kernels_nha.log 2>&1
echo "nha rc=$?"; grep -A 22 "against their two numbers" $OUT/op_kernels_nha.log | grep "x its" | cut -c1-150
