#!/bin/bash
# Session 34, call a (carry .whl, .devdata). On an H200 (issue 14's target card): session 33's
# calls a and b (340M rows at T 8192; transformer-125m against the PyTorch peer). On an H100
# (those ran there in session 33): the layer scan after session 33's change (scanned layers
# passed to nnx.scan as a tuple), transformer-350m and nha-hybrid-340m scanned at T 8192 against
# transformer-350m unscanned in the same call (session 9, H200: scanned 0.90× unscanned).
card=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$card"
if [[ "$card" == *H200* ]]; then
    mkdir -p $OUT/a $OUT/b
    OUT=$OUT/a bash experiments/benchmarks/results/s33a/run.sh
    OUT=$OUT/b bash experiments/benchmarks/results/s33b/run.sh
    exit
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
common=(--data .devdata/wikitext2_bpe32k.npz --lengths 8192 --torch '' --unpacked '' --steps 4
        --remat none)
timeout 330 python3 -m experiments.benchmarks.train_throughput "${common[@]}" --scan \
    --models transformer-350m,nha-hybrid-340m --time-limit 310 --out $OUT/scanned.json \
    > $OUT/scanned.log 2>&1; echo "scanned rc=$?"
timeout 200 python3 -m experiments.benchmarks.train_throughput "${common[@]}" \
    --models transformer-350m --time-limit 180 --out $OUT/unscanned.json \
    > $OUT/unscanned.log 2>&1; echo "unscanned rc=$?"
for f in scanned unscanned; do grep "^transformer\|^nha" $OUT/$f.log | cut -c1-220; done
