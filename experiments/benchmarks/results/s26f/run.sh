#!/bin/bash
# Session 26, call f (not run: no device lent after call c; for the next session): with the
# exact branch out of the fast kernels (ptxas: slot_logits 211 registers, dq 166, spills of
# the slot-input kernels 1.9/2.3 -> 0.7/0.9 KB), the slot-kernel forms that lost to spills
# before may win now: the sweep at B4 T8192 w512 (fwd+bwd against the defaults, default gates),
# then the same variants with every chunk on the exact path (--gate-offset 1.5, one piece).
# (Session 27: the sweep's variants are now the GPU defaults with fields changed, names to
# match; before, its "default" was BlockSizes(), not the GPU defaults at D 128.)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
V=default,slot_w8,slot_bwd_unsplit_w4,slot_bwd_split_w8,slot_inputs_tiled,slot_features_whole,slot_bwd_unsplit_w8,default
timeout 290 python3 -m experiments.benchmarks.nha_kernel --sweep --no-peer --variants $V \
    --budget-s 270 --out $OUT/sweep_fast.json > $OUT/logs/sweep_fast.log 2>&1
echo "sweep fast rc=$?"; filt < $OUT/logs/sweep_fast.log | grep -v "^{" | tail -14 | cut -c1-200
timeout 290 python3 -m experiments.benchmarks.nha_kernel --sweep --no-peer --variants $V \
    --budget-s 270 --gate-offset 1.5 --out $OUT/sweep_exact.json > $OUT/logs/sweep_exact.log 2>&1
echo "sweep exact rc=$?"; filt < $OUT/logs/sweep_exact.log | grep -v "^{" | tail -14 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
