#!/bin/bash
# Session 37, call a (carry .whl, .devdata): the delta_rule GPU check after session 36's
# forward-alone tiles (K 128 at <= 64 programs: state pass V 32; below K 128 at < 32 programs:
# fused forward V 32), then, on an H200 only, issue 14's transformer-125m row against the
# PyTorch peer (s33b's command; H100 has it from session 30).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"
OUT=$OUT/checks bash experiments/benchmarks/gpu_checks.sh delta_rule
case $gpu in
  *H200*) timeout 300 python3 -m experiments.benchmarks.train_throughput \
              --data .devdata/wikitext2_bpe32k.npz --lengths 2048 --models transformer-125m \
              --torch transformer-125m --unpacked transformer-125m --steps 6 \
              --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
          echo "rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/train_125m.log | tail -8 | cut -c1-230 ;;
esac
cd $OUT && tar czf logs.tgz checks *.log 2>/dev/null; rm -rf checks *.log
