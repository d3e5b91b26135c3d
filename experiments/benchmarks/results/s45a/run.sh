#!/bin/bash
# Session 45, call a (carry .whl, .devdata, .old = `git archive 22ede88 hybrid_jax
# pallas_kernels experiments`): Oryx-mamba2's attention mode on the kernels (values 12 head dims
# wide as value slices, `value_heads`): the flash check (with the op's wide-value rows), then
# oryx-mamba2-130m training on packed WikiText-2 at T 2048 and 8192, this tree against 22ede88
# (its attention mode on the XLA rung) and mamba2-130m, in one call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT
OUT=$OUT/checks timeout 150 bash experiments/benchmarks/gpu_checks.sh flash_attention
bench() {  # NAME TREE MODELS
    (cd $2 && PYTHONPATH=/tmp/site:$PWD timeout 210 python3 -m experiments.benchmarks.train_throughput \
        --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 2048,8192 --models $3 --steps 6 \
        --out $OUT/$1.json > $OUT/$1.log 2>&1)
    echo "== $1 rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/$1.log | tail -8 | cut -c1-230
}
bench new . oryx-mamba2-130m,mamba2-130m
bench old .old oryx-mamba2-130m
