#!/bin/bash
# Session 36, call a (carry .whl, .devdata with gutenberg00_bpe32k.npz and wikitext2_bpe32k.npz).
# On an H200 (issue 14's card, not lent since session 28): session 33's call b, transformer-125m
# against the PyTorch peer at T 2048. On an H100: gdn-130m (12 heads, K = V = 64) at few
# programs. Its forward state pass runs in V tiles of 64 and the reverse in 32 (K < 128 training
# defaults), so B 1 × T 32768 launches 12 and 24 programs for 132 SMs, B 4 × T 8192 48 and 96;
# session 35's rule (`FEW_PROGRAMS`) narrows tiles only above K 128. Rows: the defaults, the
# forward at V 32, both passes at V 16, forward 32 / reverse 16.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" == *H200* ]]; then
  bash experiments/benchmarks/results/s33b/run.sh
  exit
fi
row() {  # name, length, kernel changes
  timeout 80 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths $2 --models gdn-130m --time-limit 70 ${3:+--kernel-changes "$3"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^gdn" $OUT/$1.log | cut -c1-150
}
row b1_default 32768
row b1_f32 32768 'delta_rule:forward_value_block=32'
row b1_v16 32768 'delta_rule:value_block=16,forward_value_block=16'
row b1_f32r16 32768 'delta_rule:value_block=16,forward_value_block=32'
row b4_default 8192
row b4_f32 8192 'delta_rule:forward_value_block=32'
row b4_v16 8192 'delta_rule:value_block=16,forward_value_block=16'
cd $OUT && tar czf logs.tgz *.log && rm *.log
