#!/bin/bash
# Session 29, call d (not run: no device time left; for the next session, an H200 if one comes;
# carry .whl and .devdata): mamba2-340m against transformer-350m at T 8192 on packed WikiText-2
# with the SSD's jnp.exp back (s29a: chunk_grads −5 %, chunk_outputs −8 % on an H100, ≈ 2.9 ms
# a step over 48 layers). Session 28 (s27d, base 2): 0.896×; session 26 (s26a): 0.913×.
# Expected ≈ 0.91×; still the one 340M model behind the transformer (issue 14).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
timeout 300 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,mamba2-340m \
    --torch "" --unpacked "" --steps 4 --remat none --time-limit 270 \
    --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | tail -10 | cut -c1-240
cd $OUT && tar czf logs.tgz logs && rm -rf logs
