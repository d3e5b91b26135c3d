#!/bin/bash
# Session 27, call d (not run; for the next session; carry .whl and .devdata): the 340M rows at
# T 8192 on packed WikiText-2 with session 27's kernels (NHA window interior, every NHA, SSD and
# delta-rule exponential in base 2), each against transformer-350m in the same run (session 26,
# s26a: nha-340m 1.028x, gdn-340m 1.020x, mamba2-340m 0.913x). Expected: nha-340m and
# mamba2-340m +1-3 %, gdn-340m about as before.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 330 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m \
    --torch "" --unpacked "" --steps 4 --remat none --time-limit 300 \
    --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | tail -14 | cut -c1-240
cd $OUT && tar czf logs.tgz logs && rm -rf logs
