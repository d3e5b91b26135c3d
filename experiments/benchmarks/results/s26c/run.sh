#!/bin/bash
# Session 26, call c: the GPU check of NHA's path-split slot kernels (bf16 against float32 and
# the XLA rung; strong gates with one slot at -100 a step among the API checks, where the tree
# before gave NaN), then the fast-path table once more on both trees (noise of call b).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 200 python3 -m experiments.benchmarks.nha_kernel --check --check-variants split \
    --out $OUT/check.json > $OUT/logs/check.log 2>&1
echo "check rc=$?"; filt < $OUT/logs/check.log | grep -v "^{" | tail -14 | cut -c1-200
tab() {  # tree label offset
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.nha_kernel \
      --table --no-peer --table-variants "" --gate-offset $3 --out $OUT/table_$2.json \
      > $OUT/logs/table_$2.log 2>&1)
  echo "table $2 rc=$?"; filt < $OUT/logs/table_$2.log | grep "pallas_nha\|cudnn_swa" | cut -c1-200
}
tab .gpu/base base_fast2 0
tab . new_fast2 0
cd $OUT && tar czf logs.tgz logs && rm -rf logs
