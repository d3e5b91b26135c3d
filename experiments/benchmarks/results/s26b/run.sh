#!/bin/bash
# Session 26, call b: NHA's slot kernels split by path (each twice: a fast-only kernel over the
# chunks on the fast path, then an exact-only kernel, with session 25's level split, over the
# rest, outputs aliased) — the GPU check (bf16 against float32, strong gates with one slot at
# -100 a step), then fwd+bwd at B4 T8192 / B1 T32768 w512 on this tree and on .gpu/base
# (HEAD before: one kernel per form, a lax.cond per chunk): default gates (fast path) and
# --gate-offset 1.5 (every chunk on the exact path); the fast tables twice (noise).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
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
tab . new_fast2 0
tab .gpu/base base_fast2 0
timeout 150 python3 -m experiments.benchmarks.nha_kernel --check --check-variants split \
    --out $OUT/check.json > $OUT/logs/check.log 2>&1
echo "check rc=$?"; filt < $OUT/logs/check.log | grep -v "^{" | tail -12 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
