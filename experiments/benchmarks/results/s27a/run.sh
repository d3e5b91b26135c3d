#!/bin/bash
# Session 27, call a (not run: no device lent in session 27; for the next session). Before it:
#   rm -rf .gpu/base27 && mkdir -p .gpu/base27 && git archive a35fc7e hybrid_jax pallas_kernels \
#     'experiments/benchmarks/*.py' experiments/benchmarks/peers experiments/__init__.py \
#     pyproject.toml | tar -x -C .gpu/base27          (carry .whl and .gpu/base27)
# NHA with session 27's kernels (pallas_kernels/nha/NOTES.md, session 27: the window kernels'
# unmasked interior and base-2 logits, every slot-kernel exponential in base 2) against
# .gpu/base27 = a35fc7e (session 26's last tree): the table in turns (fast path, B4 T8192 and
# B1 T32768; cuDNN's window in the same runs), then the GPU check (bf16 against the float32
# reference, windows with documents and states included).
# Expected: NHA fwd+bwd 6.86 -> 5.8-6.3 ms at T8192 (3.85x -> 3.3-3.5x cuDNN's window).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
tab() {  # tree label
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.nha_kernel \
      --table --no-peer --table-variants "" --out $OUT/table_$2.json > $OUT/logs/table_$2.log 2>&1)
  echo "table $2 rc=$?"; filt < $OUT/logs/table_$2.log | grep "pallas_nha\|cudnn_swa" | cut -c1-200
}
tab . new
tab .gpu/base27 base
tab . new2
timeout 150 python3 -m experiments.benchmarks.nha_kernel --check --check-variants split \
    --out $OUT/check.json > $OUT/logs/check.log 2>&1
echo "check rc=$?"; filt < $OUT/logs/check.log | grep -v "^{" | tail -12 | cut -c1-200
cd $OUT && tar czf logs.tgz logs && rm -rf logs
