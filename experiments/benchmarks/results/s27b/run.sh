#!/bin/bash
# Session 27, call b (not run; for the next session, after s27a, with the same .gpu/base27 =
# a35fc7e, carry .whl and .gpu/base27): where the window kernels' time goes, kernel by kernel
# (op_kernels: device time per kernel from a profile), this tree against the one before, on
# the path training takes: NHA B4 T8192 H16 D128 w512 over packed documents of median 1500
# (the window kernels get the documents' spans and skip the mask inside them), and nha-340m's
# layer (D256, w32, documents: no interior at w 32, exp2 alone; ptxas: 15-21 % fewer
# instructions a step). Expected (w512): window forward -25..-40 %, dq -25..-40 %, dk/dv
# -5..-15 %; the slot kernels (exponentials in base 2: -18..-33 % of their instructions)
# -5..-12 %.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^I12\|^E12"; }
mkdir -p $OUT/logs
ops() {  # tree label shape window
  (cd $1 && PYTHONPATH=/tmp/site:$PWD timeout 140 python3 -m experiments.benchmarks.op_kernels \
      --ops native_hybrid_attention --shape $3 --window $4 --documents 1500 --top 14 \
      --out $OUT/ops_$2.json > $OUT/logs/ops_$2.log 2>&1)
  echo "ops $2 rc=$?"; filt < $OUT/logs/ops_$2.log | grep -v "^{" | tail -34 | cut -c1-160
}
ops . new_w512 4x8192 512
ops .gpu/base27 base_w512 4x8192 512
ops . new_340m nha-340m@4x8192 32
ops .gpu/base27 base_340m nha-340m@4x8192 32
cd $OUT && tar czf logs.tgz logs && rm -rf logs
