#!/bin/bash
# Session 46, call b (carry .whl, .devdata, .old = `git archive fe43d6e hybrid_jax pallas_kernels
# experiments`): Oryx's attention computes only the attention-mode rows (`active_queries`: the
# flash kernels skip blocks of linear-mode rows, forward and backward). The flash check (with
# the op's pallas rung on random_chunks' active rows), then Oryx-mamba2 training on packed
# WikiText-2 (random_chunks modes), this tree against fe43d6e (every row computed), one call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; mkdir -p $OUT
OUT=$OUT/checks timeout 200 bash experiments/benchmarks/gpu_checks.sh flash_attention
bench() {  # NAME TREE MODEL LENGTHS EXTRA...
    local name=$1 tree=$2 model=$3 lengths=$4; shift 4
    (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 170 python3 -m experiments.benchmarks.train_throughput \
        --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths $lengths --models $model \
        --torch "" --unpacked "" --steps 5 "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1)
    echo "== $name rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/$name.log | tail -3 | cut -c1-230
}
bench new340 . oryx-mamba2-340m 8192 --scan
bench old340 .old oryx-mamba2-340m 8192 --scan
bench new130 . oryx-mamba2-130m 2048,8192
bench old130 .old oryx-mamba2-130m 2048,8192
