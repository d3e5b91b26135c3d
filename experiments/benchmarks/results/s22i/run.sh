#!/bin/bash
# Session 22, call i: XLA's gemm addend fusion (gemm_addend.py), default flags and with the
# legacy cuBLAS path.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
timeout 120 python3 experiments/benchmarks/results/s22i/gemm_addend.py > $OUT/default.log 2>&1
echo "default rc=$?"; grep -v "^W12\|^I12" $OUT/default.log | tail -8
XLA_FLAGS=--xla_gpu_enable_cublaslt=false timeout 120 python3 experiments/benchmarks/results/s22i/gemm_addend.py > $OUT/legacy.log 2>&1
echo "legacy cublas rc=$?"; grep -v "^W12\|^I12" $OUT/legacy.log | tail -8
