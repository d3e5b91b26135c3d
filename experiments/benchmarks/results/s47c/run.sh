#!/bin/bash
# Session 47, call c — prepared, not run (no device machine came that session). Carry .whl,
# .devdata; any one GPU. The benchmark scripts now print the
# library's INFO records (which rung ran and why; experiments/cli.py run_with_logging), and
# flops.py counts Oryx (its linear mixer on every token, attention on the schedule's share of
# rows): train_throughput's oryx-mamba2-130m and mamba2-130m rows at T 8192, scanned, on packed
# WikiText-2, with the records each run logged.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1; mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models oryx-mamba2-130m,mamba2-130m --scan --torch "" --unpacked "" --steps 5 \
    --out $OUT/rows.json > $OUT/rows.log 2>&1
echo "rc=$?"; grep "^hybrid_jax\." $OUT/rows.log | sort | uniq -c | cut -c1-260
grep -v "^W12\|^I12\|^E12\|^{\|^hybrid_jax\." $OUT/rows.log | tail -10 | cut -c1-260
