#!/bin/bash
# Session 29, call b (not run: no device time left; for the next session, carry .whl): NHA's
# slot kernels in chunks of 128. They run at 69 % of the H100's HBM bandwidth over 11.6 GB of
# float32 intermediates (pallas_kernels/nha/NOTES.md, session 29); chunks of 128 halve the
# states and deltas (9.2 GB) for twice the within-chunk products. The sweep (B4 T8192 w512,
# fwd+bwd, defaults first and last), then the kernels one by one with packed documents.
# Expected if the bytes rule: fwd+bwd −0.5 … −1.0 ms (scans ≈ −50 %, prepare/deltas ≈ −25 %);
# if the C² products or registers rule (v1: 26.4 against 25.5 ms), slower.
# Then s29c (the GPU check at chunk 128) if a variant wins.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
timeout 330 python3 -m experiments.benchmarks.nha_kernel --sweep --no-peer --budget-s 300 \
    --variants default,chunk128,chunk128_bwd_w8,chunk128_w4,default \
    --out $OUT/sweep.json > $OUT/logs/sweep.log 2>&1
echo "sweep rc=$?"; filt < $OUT/logs/sweep.log | grep -v "^{" | tail -10 | cut -c1-200
timeout 200 python3 -m experiments.benchmarks.op_kernels --ops native_hybrid_attention \
    --shape 4x8192 --window 512 --documents 1500 --variants 'chunk 128 w8' --top 16 \
    --out $OUT/ops.json > $OUT/logs/ops.log 2>&1
echo "ops rc=$?"; python3 -c "
import json
rows = json.load(open('$OUT/ops.json'))['rows']
for p in sorted({r['pass'] for r in rows}):
    got = [r for r in rows if r['pass'] == p and 'ms' in r]
    print('%s %.3f' % (p, sum(r['ms'] for r in got)), ' '.join(
        '%s=%.1f' % (r['kernel'].replace('nha_', ''), 1e3 * r['ms']) for r in got if r['ms'] > 0.1))"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
