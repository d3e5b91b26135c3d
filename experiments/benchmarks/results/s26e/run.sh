#!/bin/bash
# Session 26, call e (not run: no device lent after call c; for the next session). Before it:
#   rm -rf .gpu/base && mkdir -p .gpu/base && git archive 819fccc hybrid_jax pallas_kernels \
#     'experiments/benchmarks/*.py' experiments/benchmarks/peers experiments/__init__.py \
#     pyproject.toml | tar -x -C .gpu/base          (carry .whl and .gpu/base)
# The exact path with one piece inside the sub-chunks when none decays by e^-60 (the level
# split only past that) against .gpu/base = 819fccc (the path-split kernels, level split
# always; its nha_kernel.py sets one slot to -100 a step whenever --gate-offset is given):
# --gate-offset 1.5 puts every chunk on the exact path (one piece), --extreme-slot adds slot 0
# at -100 a step (the level split in every chunk); the fast path as a control. Expected: one
# piece from 15.7 ms towards session 25's 8.7 (pieces inside the sub-chunks 5 -> 1), the level
# split and the fast path as before (15.7, 6.86-6.89).
# (Session 27: this tree now also has the window kernels' unmasked interior and exp2, so
# its rows against .gpu/base hold both changes; new_one_piece against new_levels is the
# one-piece change alone, and new_fast against base_fast session 27's.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
tab() {  # tree label offset [flags]
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.nha_kernel \
      --table --no-peer --table-variants "" --gate-offset $3 $4 --out $OUT/table_$2.json \
      > $OUT/logs/table_$2.log 2>&1)
  echo "table $2 rc=$?"; filt < $OUT/logs/table_$2.log | grep "pallas_nha\|cudnn_swa" | cut -c1-200
}
tab . new_one_piece 1.5
tab .gpu/base base_levels 1.5
tab . new_levels 1.5 --extreme-slot
tab . new_fast 0
tab .gpu/base base_fast 0
timeout 150 python3 -m experiments.benchmarks.nha_kernel --check --check-variants split \
    --out $OUT/check.json > $OUT/logs/check.log 2>&1
echo "check rc=$?"; filt < $OUT/logs/check.log | grep -v "^{" | tail -12 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
