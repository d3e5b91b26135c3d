#!/bin/bash
# Session 22, call a (cold): mamba2-340m on packed WikiText-2 at T 8192 with (this tree) B, C
# and dt as one product, B and C through one conv, and the global gradient norm's small
# leaves in one reduction; transformer-350m beside it (its only change: the norm); then
# mamba2-340m on the previous tree (.gpu/base, git archive of 03af2cb), same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
train() {  # tree, models, out name, seconds
  (cd $1 && timeout $4 python3 -m experiments.benchmarks.train_throughput \
      --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 8192 --models $2 --torch "" \
      --unpacked "" --steps 4 --remat none --out $OUT/$3.json > $OUT/$3.log 2>&1)
  echo "train $3 rc=$?"; filt $OUT/$3.log | grep -v "^{" | tail -5 | cut -c1-200
}
train . mamba2-340m,transformer-350m train_new 270
PYTHONPATH=/tmp/site:$PWD/.gpu/base train .gpu/base mamba2-340m train_base 180
