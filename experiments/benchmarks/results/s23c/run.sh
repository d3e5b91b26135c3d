#!/bin/bash
# Session 23, call c: the logit-statistics kernel with per-lane statistics (no reduction across
# lanes in the loop): check, table, tiles; transformer-125m's step on this tree and on
# .gpu/base (HEAD before the kernel): a profile of each, then train rows in turn.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
timeout 170 python3 -m experiments.benchmarks.logit_stats --parts check,table --variants all \
    --out $OUT/logit_stats.json > $OUT/logit_stats.log 2>&1
filt < $OUT/logit_stats.log | grep -v "^rows" | tail -30
DATA=$PWD/.devdata/wikitext2_bpe32k.npz
mkdir -p $OUT/logs
prof() {  # tree label
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m experiments.benchmarks.profile_step \
      --model transformer-125m --length 2048 --data $DATA --modes packed --steps 3 --remat none \
      --top 12 --out $OUT/logs/profile_$2.json > $OUT/logs/profile_$2.log 2>&1)
  echo "profile $2 rc=$?"; filt < $OUT/logs/profile_$2.log | sed -n '3,12p' | cut -c1-150
  grep "logit_stats\|input_reduce_fusion" $OUT/logs/profile_$2.log | head -4 | cut -c1-150
}
prof . new
prof .gpu/base base
row() {  # tree label torch-models
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.train_throughput \
      --data $DATA --lengths 2048 --models transformer-125m --unpacked "" --torch "$3" --steps 6 \
      --out $OUT/logs/tt_$2.json > $OUT/logs/tt_$2.log 2>&1)
  echo "row $2 rc=$?"; filt < $OUT/logs/tt_$2.log | grep "^transformer-125m  jax\|^transformer-125m  torch" | cut -c1-200
}
row . new1 ""
row .gpu/base base1 ""
row . new2 ""
row .gpu/base base2 ""
row . new3 ""
row .gpu/base base3 ""
tar -czf $OUT/logs.tgz -C $OUT logs && rm -rf $OUT/logs
