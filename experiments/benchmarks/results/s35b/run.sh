#!/bin/bash
# Session 35, call b (carry .whl, .devdata with gutenberg00_bpe32k.npz): the books rows at
# B 1 × T 32768 again after the SSD readout's bf16 cotangent (s34e) and gdn's V 32 rule (s35a),
# with transformer-350m in the same call (s34b: 48,228; gdn 2.28×, mamba2 2.07×).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
timeout 480 python3 -m experiments.benchmarks.train_throughput \
    --data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none \
    --lengths 32768 --models transformer-350m,gdn-340m,mamba2-340m --time-limit 460 \
    --out $OUT/books32768.json > $OUT/books32768.log 2>&1
echo "rc=$?"; grep "^model\|^transformer\|^gdn\|^mamba" $OUT/books32768.log | cut -c1-140
