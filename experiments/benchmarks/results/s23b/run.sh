#!/bin/bash
# Session 23, call b: the logit-statistics kernel (check, table, tiles), then transformer-125m's
# step on this tree and on .gpu/base (HEAD before the kernel): profiles, then train rows.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
timeout 170 python3 -m experiments.benchmarks.logit_stats --parts check,table --variants all \
    --out $OUT/logit_stats.json 2>&1 | filt | tail -40
DATA=$PWD/.devdata/wikitext2_bpe32k.npz
prof() {  # tree label
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m experiments.benchmarks.profile_step \
      --model transformer-125m --length 2048 --data $DATA --modes packed --steps 3 --remat none \
      --top 12 --out $OUT/profile_$2.json > $OUT/profile_$2.log 2>&1)
  echo "profile $2 rc=$?"; filt < $OUT/profile_$2.log | sed -n '3,28p' | cut -c1-150
}
prof . new
prof .gpu/base base
row() {  # tree label torch-models
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.train_throughput \
      --data $DATA --lengths 2048 --models transformer-125m --unpacked "" --torch "$3" --steps 6 \
      --out $OUT/tt_$2.json > $OUT/tt_$2.log 2>&1)
  echo "row $2 rc=$?"; filt < $OUT/tt_$2.log | tail -8 | cut -c1-220
}
row . new1 transformer-125m
row .gpu/base base1 ""
row . new2 ""
row .gpu/base base2 ""
