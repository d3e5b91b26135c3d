#!/bin/bash
# Session 9, call c (issues 14, 16). Call b's profile of gdn-340m without remat put 44 ms of
# its 328 ms step in memcpy (1,050 copies a step, ~50 a layer): the layer scan copies each
# saved residual that a custom call (a Pallas kernel, a cuBLAS matmul) wrote into its stacked
# buffer. Unscanned layers keep them where they were written: gdn-340m and transformer-350m
# unscanned without remat, then gdn-340m's unscanned step profile. Then PHA's inference row with
# XLA's GPU compiler logging (it stalls in the model init's compile).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
D=.devdata/wikitext2_bpe32k.npz
timeout 230 python3 -m experiments.benchmarks.train_throughput --data $D --lengths 8192 \
    --models gdn-340m,transformer-350m --torch "" --unpacked "" --steps 4 \
    --remat none --no-scan --time-limit 200 --out $OUT/train_noscan.json > $OUT/train_noscan.log 2>&1; echo "train rc=$?"
filt $OUT/train_noscan.log | grep -v '^{' | tail -6
grep -n "def profile_mode" -A3 experiments/benchmarks/profile_step.py >/dev/null
timeout 30 nvidia-smi --query-gpu=memory.used --format=csv,noheader
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=2,nvptx_compiler=2,autotuner_util=1,gemm_fusion_autotuner=1 \
  timeout 100 python3 -m experiments.benchmarks.pha_efficiency --models pha-180m \
    --parts inference --lengths 8192 --time-limit 90 --out $OUT/pha_inference.json > $OUT/pha_inference.log 2>&1; echo "pha rc=$?"
grep -v "^W12" $OUT/pha_inference.log | grep -v "^  File" | tail -40
