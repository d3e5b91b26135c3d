#!/bin/bash
# Session 11, call b (issue 15): fla's fwd+bwd at last — GSA, SSD and GDN against fla in the
# same run, fla's autotuning compiled first by 12 parallel warm-up workers (`--fla-warm`);
# and JAX's Mosaic GPU attention forward in float16 beside cuDNN (the lowering question).
# From the repo root, carrying .whl. The Triton cache comes back split in 15 MB parts.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
timeout 100 python3 -m experiments.benchmarks.flash_attention --parts table --shapes 125m,d128 \
    --skip xla,swa --out $OUT/fa_mosaic.json > $OUT/fa_mosaic.log 2>&1
echo "fa rc=$?"
filt $OUT/fa_mosaic.log | tail -16
timeout 470 python3 -m experiments.benchmarks.linear_ops --parts table \
    --ops gated_slot_attention,ssd,gated_delta_rule --impls pallas --variants none \
    --shapes 4x8192,gdn-340m@4x8192 --fla-cache /tmp/triton_fla --fla-warm 12 \
    --fla-timeout 380 --time-limit 460 --out $OUT/linear_fla.json > $OUT/linear_fla.log 2>&1
echo "linear rc=$?"
filt $OUT/linear_fla.log | grep -v "^{" | tail -24
grep "fla peer\|fla warm" $OUT/linear_fla.log | cut -c1-400
cd /tmp && tar czf triton_fla.tgz triton_fla && split -b 15M triton_fla.tgz $OUT/triton_fla.tgz.part_ && ls -la $OUT | tail -5
