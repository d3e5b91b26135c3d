#!/bin/bash
# Session 23, call e: issue 14's 340M rows at T 8192 on packed WikiText-2 with the loss
# statistics kernel, one process (transformer-350m first, the baseline).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 340 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m,gdn-340m,nha-340m,mamba2-340m --torch "" \
    --unpacked "" --steps 4 --remat none --out $OUT/tt_340m.json > $OUT/tt_340m.log 2>&1
echo "rows rc=$?"; grep -v "^W12\|^I12\|^E12" $OUT/tt_340m.log | grep "^model\|-3[45]0m " | cut -c1-200
