#!/bin/bash
# Final device call of 2026-12-01 (issues 14, 16): the flash-attention accuracy check of the final kernel,
# then training throughput at T = 8192 / 32768 of the transformer, hybrids and recurrent models (~350M), PHA-180M
# against attention-only-180M, on packed WikiText-2 BPE text, each model in the same call.
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
: timeout 100 python3 -m experiments.benchmarks.flash_attention --parts check --out $OUT/fa.json > $OUT/fa.log 2>&1; echo "flash check rc=$?"
grep -iE "max|err|rel|pass|fail" $OUT/fa.log | tail -15
timeout 420 python3 -m experiments.benchmarks.train_throughput --data data/wikitext2_bpe32k.npz \
    --lengths 8192,32768 --models transformer-350m,gdn-340m,nha-hybrid-340m,mamba2-130m,pha-180m,attention-only-180m \
    --steps 4 --torch "" --unpacked "" --remat full --time-limit 390 --out $OUT/tt.json > $OUT/tt.log 2>&1; echo "throughput rc=$?"
grep -v "^W1201\|^If this\|^Current\|^\*" $OUT/tt.log | tail -40
