#!/bin/bash
# Session 33, call c (carry .whl): the GPU checks of the kernels changed since their last GPU
# check — logit_stats, rms_norm and short_conv (session 27's exp2 in gpu_elementwise and the
# loss statistics: never checked on a GPU since), ssd and nha (session 29's return to jnp.exp in
# SSD chunk_math and NHA chunk_prepare) — then delta_rule if time is left.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD
OUT=$OUT bash experiments/benchmarks/gpu_checks.sh logit_stats rms_norm short_conv ssd nha delta_rule
