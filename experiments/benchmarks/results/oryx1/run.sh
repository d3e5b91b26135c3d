#!/bin/bash
# Issue 17 (Oryx), one device call, <= 4 min: self-speculative decoding against attention-mode
# decoding on one H200.
#   1. lm-wikitext2-oryx-gdn-small (6 Oryx-GDN layers x 512, byte-level, ~22M params) trained
#      250 steps (at most 60 s, compile included: train.time_limit_s) on WikiText-2 (a trained
#      model: acceptance and tokens/s mean something), then greedy decoding of 128 bytes after
#      64-byte held-out prompts, attention mode vs speculative k = 2, 4, at batch 1 and 8.
#   2. the 130M presets oryx-gdn-130m and oryx-mamba2-130m with RANDOM weights (bf16 compute,
#      batch 1, k 4): the cost of a round at that size (an untrained model's drafts rarely
#      match, so these rows are not an acceptance measurement), then oryx-*-340m if the
#      budget allows. Configurations past the 200 s budget are listed as skipped.
# Needs .devdata/wiki.train.raw and .devdata/wiki.valid.raw (made on the dev machine by
#   mkdir -p .devdata && cp ../shared/data/wikitext-2-raw/wiki.{train,valid}.raw .devdata/)
# and the lead's wheels installed to /tmp/site before. Writes $OUT/speculative.json and .log.
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/oryx1}; mkdir -p $OUT
timeout ${ORYX_TIMEOUT:-230} python3 -m experiments.benchmarks.oryx_speculative \
    --train lm-wikitext2-oryx-gdn-small --steps 250 --out-dir /tmp/oryx1-small \
    --set data.path=.devdata/wiki.train.raw --set data.eval_path=.devdata/wiki.valid.raw \
    --set train.warmup_steps=25 --set train.time_limit_s=60 \
    --k 2,4 --batch 1,8 --prompt-len 64 --new-tokens 128 \
    --presets oryx-gdn-130m,oryx-mamba2-130m,oryx-gdn-340m,oryx-mamba2-340m --dtype bfloat16 \
    --presets-k 4 --presets-batch 1 \
    --budget-s ${ORYX_BUDGET:-200} --out $OUT/speculative.json 2>&1 | tee $OUT/speculative.log
echo "oryx_speculative rc=${PIPESTATUS[0]}"
