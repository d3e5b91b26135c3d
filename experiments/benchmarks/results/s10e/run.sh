#!/bin/bash
# Session 10, call e: mamba2-340m at T 32768 (B 1) on packed Gutenberg after the SSD segments'
# readout is recomputed in the backward (call b: 71.5 GiB, against 61.6 at T 8192).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 250 python3 -m experiments.benchmarks.train_throughput --data .devdata/gutenberg00_bpe32k.npz \
    --lengths 32768 --models mamba2-340m --torch "" --unpacked "" --steps 4 --remat none \
    --no-scan --out $OUT/train_mamba2_32768.json > $OUT/train_mamba2_32768.log 2>&1
echo "train rc=$?"; filt $OUT/train_mamba2_32768.log | tail -3
