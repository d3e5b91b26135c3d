#!/bin/bash
# Session 29, call a (carry .whl and .gpu/head = HEAD 1ae67f8 via git archive, as .gpu/base27):
# session 27's base-2 exponentials timed kernel by kernel on the H100 (s27c, s27b) made
# ssd_chunk_grads 0.779 -> 0.814 ms (+4.5 %) and ssd_chunk_outputs 0.224 -> 0.242 (+7.9 %) at
# mamba2-340m's layer, and nha_chunk_prepare 0.423 -> 0.468 (+10.6 %), the other kernels of
# those processes unchanged to 0.3 %. This tree takes jnp.exp again in the SSD's chunk_math and
# in NHA's chunk_prepare. Each tree twice, in turns (process-to-process spread), then NHA.
# Expected if the regressions are real: SSD back to ≈ 0.78 / 0.224, chunk_prepare ≈ 0.42.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
ops() {  # tree label op shape [flags]
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m experiments.benchmarks.op_kernels \
      --ops $3 --shape $4 $5 --top 14 --out $OUT/ops_$2.json > $OUT/logs/ops_$2.log 2>&1)
  echo "ops $2 rc=$?"; python3 -c "
import json, sys
for p in ('fwd', 'fwd+bwd'):
    rows = [r for r in json.load(open('$OUT/ops_$2.json'))['rows'] if r.get('pass') == p]
    print('  %s %.3f' % (p, sum(r['ms'] for r in rows)), ' '.join(
        '%s=%.1f' % (r['kernel'].replace('nha_', '').replace('ssd_', ''), 1e3 * r['ms'])
        for r in rows if r['ms'] > 0.1))"
}
for i in 1 2; do
  ops . exp_ssd$i ssd mamba2-340m@4x8192 "--documents 1500 --skip-d"
  ops .gpu/head head_ssd$i ssd mamba2-340m@4x8192 "--documents 1500 --skip-d"
done
ops . exp_nha native_hybrid_attention 4x8192 "--window 512 --documents 1500"
ops .gpu/head head_nha native_hybrid_attention 4x8192 "--window 512 --documents 1500"
cd $OUT && tar czf logs.tgz logs && rm -rf logs
