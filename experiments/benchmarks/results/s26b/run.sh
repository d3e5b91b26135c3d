#!/bin/bash
# Session 26, call b: NHA's slot kernels split by path (each twice: a fast-only kernel over the
# chunks on the fast path, then an exact-only kernel, with session 25's level split, over the
# rest, outputs aliased): fwd+bwd at B4 T8192 / B1 T32768 w512 on this tree and on .gpu/base
# (HEAD before: one kernel per form, a lax.cond per chunk): default gates (fast path) and
# --gate-offset 1.5 (every chunk on the exact path); then each kernel stage alone on both
# trees (the profile part). The GPU check comes in call c.
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
prof() {  # tree label: each kernel stage alone (default gates), the exact launches' cost
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 70 python3 -m experiments.benchmarks.nha_kernel \
      --parts profile --out $OUT/profile_$2.json > $OUT/logs/profile_$2.log 2>&1)
  echo "profile $2 rc=$?"; filt < $OUT/logs/profile_$2.log | grep -v "^{" | tail -16 | cut -c1-160
}
prof . new
prof .gpu/base base
cd $OUT && tar czf logs.tgz logs && rm -rf logs
