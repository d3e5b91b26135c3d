#!/bin/bash
# Session 34, call e (carry .whl, .devdata with gutenberg00_bpe32k.npz): the SSD segments'
# entering-state readout with a bf16 cotangent (`pallas_kernels/ssd/segments.py`, `_readout`):
# the SSD GPU check, then mamba2-340m's B 1 × T 32768 step profiled as in s34d (there: 330.5 ms,
# an FFMA float32 GEMM of 15.2 ms a step from autodiff's transposes of the readout).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
bash experiments/benchmarks/gpu_checks.sh ssd 2>&1 | tail -4
timeout 170 python3 -m experiments.benchmarks.profile_step --model mamba2-340m --length 32768 \
    --data .devdata/gutenberg00_bpe32k.npz --modes packed --steps 3 --remat none --top 25 \
    --out $OUT/mamba2-340m_32768.json > $OUT/mamba2-340m_32768.log 2>&1
echo "profile rc=$?"; grep -v "^W12\|^I12\|^E12" $OUT/mamba2-340m_32768.log | head -34 | cut -c1-150
