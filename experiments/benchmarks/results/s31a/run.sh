#!/bin/bash
# Session 31, call a (carry .whl, .devdata): (1) where transformer-125m's packed T 2048 step goes
# after session 30's D 64 flash-attention tiles (issue 14's 45 % MFU target needs ≈ 5 ms less of
# ≈ 66); (2) s29d's mamba2-340m against transformer-350m at T 8192 after the SSD revert, with
# JAX holding 95 % of the memory so the remat-none step fits an H100 (s29d fell back to full remat).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.95
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
timeout 200 python3 -m experiments.benchmarks.profile_step --model transformer-125m --length 2048 \
    --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none --top 40 \
    --out $OUT/profile125.json > $OUT/logs/profile125.log 2>&1
echo "profile125 rc=$?"; filt < $OUT/logs/profile125.log | grep -v "^{" | head -150 | cut -c1-200
timeout 300 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,mamba2-340m \
    --torch "" --unpacked "" --steps 4 --remat none --time-limit 270 \
    --out $OUT/tt340.json > $OUT/logs/tt340.log 2>&1
echo "tt340 rc=$?"; filt < $OUT/logs/tt340.log | grep "^transformer\|^mamba" | cut -c1-220
cd $OUT && tar czf logs.tgz logs && rm -rf logs
