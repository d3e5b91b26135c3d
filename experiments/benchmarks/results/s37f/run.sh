#!/bin/bash
# Session 37, call f (carry .whl, .devdata): session 36's rule (below K 128, training at < 32
# programs of 64 columns: both state passes at V 16) at a second model, oryx-gdn-340m (16 heads
# of K = V = 64: B 1 launches 16 programs), packed WikiText-2 at B 1 x T 32768: the rule against
# the earlier tiles (forward 64 / reverse 32), same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
row() {  # name, kernel changes
  timeout 200 python3 -m experiments.benchmarks.train_throughput \
      --data .devdata/wikitext2_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
      --lengths 32768 --models oryx-gdn-340m --time-limit 190 ${2:+--kernel-changes "$2"} \
      --out $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; grep "^oryx" $OUT/$1.log | cut -c1-170
}
row b1_rule
row b1_wide 'delta_rule:value_block=32,forward_value_block=64'
cd $OUT && tar czf logs.tgz *.log && rm *.log
