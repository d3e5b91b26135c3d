#!/bin/bash
# Session 30, call b (carry .whl, .devdata, .gpu/base = e2bd143): flash attention's D 64
# defaults from the s30a sweep (CALLS timing, five rounds each: forward 0.345 → 0.305 ms,
# dq 0.323 → 0.309, dk/dv 0.471 → 0.443; the table's packed fwd+bwd 1.156 → 1.090, −5.7 %,
# as s26d's 1.16 → 1.10) at the model: transformer-125m T2048 packed, this tree against the
# base in turns, the PyTorch peer once. Expected: ≈ 12 layers × 0.066 ms ≈ 0.8 ms of a
# ≈ 45 ms step, +1 … 2 % tokens/s.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
DATA=$PWD/.devdata/wikitext2_bpe32k.npz
mkdir -p $OUT/logs
row() {  # tree label torch-models
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 -m experiments.benchmarks.train_throughput \
      --data $DATA --lengths 2048 --models transformer-125m --unpacked "" --torch "$3" --steps 6 \
      --out $OUT/logs/tt_$2.json > $OUT/logs/tt_$2.log 2>&1)
  echo "row $2 rc=$?"; filt < $OUT/logs/tt_$2.log | grep "^transformer-125m  jax\|^transformer-125m  torch" | cut -c1-200
}
row . new1 "transformer-125m"
row .gpu/base base1 ""
row . new2 ""
row .gpu/base base2 ""
row . new3 ""
row .gpu/base base3 ""
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
