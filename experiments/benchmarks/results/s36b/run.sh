#!/bin/bash
# Session 36, call b (carry .whl, .devdata with gutenberg00_bpe32k.npz). The K < 128 rule of
# `FEW_PROGRAMS_BELOW_K128` (s36a: gdn-130m B 1 × T 32768 +5.4 % at V 16): the GPU check (its
# K 64 cases at 2 heads now V 16, a new B 4 × 16-head K 64 case keeps the wide tiles), then
# gdn-130m at B 2 × T 16384 (24 programs: the rule narrows) against the wide tiles forced, B 1
# again, and mamba2-130m at B 1 × 32768 and B 4 × 8192 (does the SSD lose at few programs?).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 bash experiments/benchmarks/gpu_checks.sh delta_rule 2>&1 | tail -14
row() {  # name, model, length, kernel changes
  timeout 80 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths $3 --models $2 --time-limit 70 ${4:+--kernel-changes "$4"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^gdn\|^mamba" $OUT/$1.log | cut -c1-150
}
row b2_rule gdn-130m 16384
row b2_wide gdn-130m 16384 'delta_rule:value_block=32,forward_value_block=64'
row b1_rule gdn-130m 32768
row m_b1 mamba2-130m 32768
row m_b4 mamba2-130m 8192
cd $OUT && tar czf logs.tgz *.log && rm *.log
