#!/bin/bash
# Session 35, call a (carry .whl, .devdata with gutenberg00_bpe32k.npz): gdn-340m's two
# sequential state passes in V tiles of 32 when few programs run (`FEW_PROGRAMS` in
# pallas_kernels/delta_rule/block_sizes.py: B·H·V/64 < 64). s34f: B 1 × T 32768 (24
# programs) 110,441 → 119,478 tokens/s with both passes at 32. First the GPU check (its K 256
# cases now run V 32 and, at 16 heads × B 4, V 64); then where the rule acts (B 1: 24
# programs; B 2 × 16384: 48, against V 64 forced) and where it does not (B 4 × 8192: 96,
# against V 32 forced).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
bash experiments/benchmarks/gpu_checks.sh delta_rule 2>&1 | tail -12
row() {  # name, length, kernel changes
  timeout 105 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths $2 --models gdn-340m --time-limit 90 ${3:+--kernel-changes "$3"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^gdn" $OUT/$1.log | cut -c1-120
}
row b1_rule 32768
row b2_rule 16384
row b2_v64 16384 'delta_rule:value_block=64,forward_value_block=64'
row b4_default 8192
row b4_v32 8192 'delta_rule:value_block=32,forward_value_block=32'
cd $OUT && tar czf logs.tgz *.log && rm *.log
