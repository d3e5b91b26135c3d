#!/bin/bash
# Session 34, call b (carry .whl, .devdata with gutenberg00_bpe32k.npz): issue 14's 340M rows
# on long documents (Gutenberg train-00, 1.12 books a row), all five models in one process.
# Books were last measured on the H200 (sessions 10-18: every hybrid ahead of transformer-350m
# at T 8192); session 33's H100 rows were packed WikiText-2 (3.38 documents a row).
# With T32768_S (seconds): T 32768 (batch 1) for the four non-hybrid-attention rows (T8192_S=0
# skips the first part; call c ran `T8192_S=0 T32768_S=540`).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
common=(--data .devdata/gutenberg00_bpe32k.npz --torch '' --unpacked '' --steps 4 --remat none)
[ "${T8192_S:-520}" != 0 ] && timeout ${T8192_S:-520} python3 -m experiments.benchmarks.train_throughput "${common[@]}" \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m,nha-hybrid-340m \
    --time-limit $(( ${T8192_S:-520} - 20 )) --out $OUT/books8192.json > $OUT/logs/books8192.log 2>&1
[ "${T8192_S:-520}" != 0 ] && echo "books8192 rc=$?"
if [ -n "$T32768_S" ]; then
  timeout $T32768_S python3 -m experiments.benchmarks.train_throughput "${common[@]}" \
      --lengths 32768 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m \
      --time-limit $(( T32768_S - 20 )) --out $OUT/books32768.json > $OUT/logs/books32768.log 2>&1
  echo "books32768 rc=$?"
fi
grep -h "^transformer\|^gdn\|^nha\|^mamba" $OUT/logs/*.log | cut -c1-220
cd $OUT && tar czf logs.tgz logs && rm -rf logs
