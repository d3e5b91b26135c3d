#!/bin/bash
# Device call 4 (issue 14): the 24-layer 350M transformer compiled unscanned, then T = 8192 for
# the transformer and the hybrids / recurrent models of its size (remat where memory needs it).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
timeout 140 python3 -m experiments.benchmarks.train_throughput --data data/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-hybrid-340m,mamba2-130m --steps 5 \
    --torch "" --unpacked "" --compile-check transformer-350m --time-limit 105 \
    --out $OUT/tt.json > $OUT/tt.log 2>&1
grep "^{" $OUT/tt.log; grep -v "^{\|^W1201\|^If this\|^Current\|^\*" $OUT/tt.log | tail -12
