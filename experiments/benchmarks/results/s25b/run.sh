#!/bin/bash
# Session 25, call b (run at 77e3f82, the level split, since reverted; its nha_kernel.py then
# also set one slot's gates to -100 a step with --gate-offset): NHA's exact path after the level
# split inside the diagonal sub-chunk —
# the GPU check (bf16 against float32, strong gates with one slot at -100 a step among the API
# checks), then fwd+bwd at B4 T8192 / B1 T32768 w512 on this tree and on .gpu/base (HEAD
# before the change, with this tree's nha_kernel.py): default gates (the fast path: no change
# expected) and --gate-offset 1.5 (every chunk on the exact path).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
timeout 200 python3 -m experiments.benchmarks.nha_kernel --check --check-variants split \
    --out $OUT/check.json > $OUT/logs/check.log 2>&1
echo "check rc=$?"; filt < $OUT/logs/check.log | grep -v "^{" | tail -12 | cut -c1-200
tab() {  # tree label offset
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.nha_kernel \
      --table --no-peer --table-variants "" --gate-offset $3 --out $OUT/table_$2.json \
      > $OUT/logs/table_$2.log 2>&1)
  echo "table $2 rc=$?"; filt < $OUT/logs/table_$2.log | grep "pallas_nha\|cudnn_swa" | cut -c1-200
}
tab . new_fast 0
tab .gpu/base base_fast 0
tab . new_exact 1.5
tab .gpu/base base_exact 1.5
cd $OUT && tar czf logs.tgz logs && rm -rf logs
