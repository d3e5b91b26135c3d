#!/bin/bash
# Session 21, call a (cold): 1) the SSD GPU check, Mamba-2's skip D now in every case (added by
# the kernel that writes y); 2) mamba2-340m on packed WikiText-2 at T 8192 with the skip in the
# kernel (this tree) and transformer-350m beside it; 3) mamba2-340m on the previous tree
# (.gpu/base: the skip added by XLA after the op), same call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 150 python3 -m experiments.benchmarks.linear_ops --parts check --ops ssd --no-fla \
    --out $OUT/ssd_check.json > $OUT/ssd_check.log 2>&1
echo "ssd check rc=$?"; filt $OUT/ssd_check.log | grep -v "^{" | tail -8 | cut -c1-220
train() {  # tree, models, out name, seconds
  (cd $1 && timeout $4 python3 -m experiments.benchmarks.train_throughput \
      --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 8192 --models $2 --torch "" \
      --unpacked "" --steps 4 --remat none --out $OUT/$3.json > $OUT/$3.log 2>&1)
  echo "train $3 rc=$?"; filt $OUT/$3.log | grep -v "^{" | tail -5 | cut -c1-200
}
train . mamba2-340m,transformer-350m train_new 260
PYTHONPATH=/tmp/site:$PWD/.gpu/base train .gpu/base mamba2-340m train_base 180
