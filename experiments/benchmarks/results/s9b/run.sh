#!/bin/bash
# Session 9, call b (issues 14, 16): with the short-conv kernels now automatic on GPUs and the
# swept backward tiles: the NHA models against transformer-350m at T 8192 packed without remat;
# where gdn-340m's step goes without remat (it was no faster than under remat "full"); PHA's
# inference row alone with XLA's GPU compile on one thread (it stalled in three calls).
# From the repo root, carrying .whl and .devdata.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
D=.devdata/wikitext2_bpe32k.npz
timeout 200 python3 -m experiments.benchmarks.train_throughput --data $D --lengths 8192 \
    --models nha-340m,nha-hybrid-340m,transformer-350m,gdn-340m --torch "" --unpacked "" --steps 4 \
    --remat none --time-limit 180 --out $OUT/train_none.json > $OUT/train_none.log 2>&1; echo "train rc=$?"
filt $OUT/train_none.log | grep -v '^{' | tail -7
timeout 120 python3 -m experiments.benchmarks.profile_step --model gdn-340m --length 8192 \
    --tokens 32768 --data $D --modes packed --steps 3 --remat none --top 30 \
    --out $OUT/profile_gdn.json > $OUT/profile_gdn.log 2>&1; echo "profile rc=$?"
filt $OUT/profile_gdn.log | tail -60
XLA_FLAGS=--xla_gpu_force_compilation_parallelism=1 timeout 150 python3 -m experiments.benchmarks.pha_efficiency \
    --models pha-180m,attention-only-180m --parts inference --lengths 8192 --time-limit 140 \
    --out $OUT/pha_inference.json > $OUT/pha_inference.log 2>&1; echo "pha rc=$?"
filt $OUT/pha_inference.log | tail -12
