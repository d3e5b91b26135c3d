#!/bin/bash
# Session 23, call a: a 2-layer nha-340m step profiled with its optimized HLO (probe.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=experiments/benchmarks/results/s23a
timeout 240 python3 $D/probe.py 2 $OUT/nha2.hlo.txt --model nha-340m --length 8192 \
    --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 --remat none --top 150 \
    --out $OUT/profile_nha2.json > $OUT/profile_nha2.log 2>&1
echo "probe rc=$?"; grep -v "^W12\|^I12" $OUT/profile_nha2.log | head -30 | cut -c1-160
gzip -f $OUT/nha2.hlo.txt; ls -la $OUT
