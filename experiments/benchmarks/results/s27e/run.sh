#!/bin/bash
# Session 27, call e (not run; for the next session, after s27a; carry .whl): with the window
# kernels' unmasked interior and base-2 logits, the window tiles chosen under the old kernels
# may no longer be best. ptxas (B4 T8192 H16 D128 w512; pallas_kernels/nha/NOTES.md, session
# 27): the key-major dk/dv kernel (the default since session 19) spills 76-84 stores/loads a
# loop step at 741 / 1,057 instructions (interior / edge); query-major 30-60 at 579 / 759; at
# 8 backward warps no spills in its loops (545 / 773 a warp; dq 170 registers). The forward's
# 3 stages hold 114 KB of shared memory (one program a SM); 2 stages fit two. The sweep at
# default gates, fwd+bwd against the defaults (first and last row).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
V=default,dkv_query_major,bwd_w8_only,bwd_w8_dkv_query_major,q64_s2,bwd_s3,default
timeout 300 python3 -m experiments.benchmarks.nha_kernel --sweep --no-peer --variants $V \
    --budget-s 280 --out $OUT/sweep.json > $OUT/logs/sweep.log 2>&1
echo "sweep rc=$?"; filt < $OUT/logs/sweep.log | grep -v "^{" | tail -12 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
