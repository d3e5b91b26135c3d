#!/bin/bash
# Session 36, call e (carry .whl, .devdata with gutenberg00_bpe32k.npz). s36d: mamba2-130m's
# B 1 × T 32768 step spends ≈ 16 ms of 123 in the SSD segments' XLA combine (B 4 × T 8192 has
# none), near bandwidth; its largest array is the entering-state readout `[B, S−1, L, H, P]`
# in float32. The tree rounds that readout to bf16 (the operands' dtype) before the float32
# weight and add. The SSD GPU check (two cases run S = 2), then mamba2-130m at B 1 × T 32768
# with session 35's combine (segments_head.py, made before the call and not committed:
# `git show 692a9f3:pallas_kernels/ssd/segments.py > experiments/benchmarks/results/s36e/segments_head.py`)
# copied over, and with the tree's.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 bash experiments/benchmarks/gpu_checks.sh ssd 2>&1 | tail -9
row() {  # name
  timeout 80 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 6 --remat none \
      --lengths 32768 --models mamba2-130m --time-limit 70 --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^mamba" $OUT/$1.log | cut -c1-150
}
cp pallas_kernels/ssd/segments.py /tmp/segments_tree.py
cp experiments/benchmarks/results/s36e/segments_head.py pallas_kernels/ssd/segments.py
row head
cp /tmp/segments_tree.py pallas_kernels/ssd/segments.py
row bf16_readout
cd $OUT && tar czf logs.tgz *.log && rm *.log
