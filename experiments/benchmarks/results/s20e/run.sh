#!/bin/bash
# Session 20, call e (cold): 1) RoPE's backward as the inverse rotation (a custom VJP, one
# elementwise pass) against the autodiff form: transformer-125m's packed step profiled on this
# tree and on the tree before the change (.gpu/base, `git archive` of fa8bdba: hybrid_jax,
# pallas_kernels, experiments), same call; 2) GDN's `prepare_loads_first` (session 19, untimed in
# kernel time) against its control, the forward's and fwd+bwd's kernels (op_kernels --forwards).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
for tree in new base; do
  dir=$ROOT; [ $tree = base ] && dir=$ROOT/.gpu/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 -m experiments.benchmarks.profile_step \
      --model transformer-125m --length 2048 --data $ROOT/.devdata/wikitext2_bpe32k.npz --modes packed \
      --steps 3 --remat none --out $OUT/profile_125m_$tree.json > $OUT/profile_125m_$tree.log 2>&1)
  echo "$tree rc=$?"; grep "ms per step\|device time\|apply_rope" $OUT/profile_125m_$tree.log | cut -c1-150
done
export PYTHONPATH=/tmp/site:$ROOT
timeout 150 python3 -m experiments.benchmarks.op_kernels --ops gated_delta_rule --shape 4x8192 --top 6 \
    --variants 'prepare TF32 merges;prepare loads first' --forwards \
    --out $OUT/op_kernels_gdn.json > $OUT/op_kernels_gdn.log 2>&1
echo "gdn rc=$?"; grep "ms of kernels\|chunk_prepare" $OUT/op_kernels_gdn.log | cut -c1-120
