#!/bin/bash
# Session 46, call a (carry .whl, .devdata, .old = `git archive 22ede88 hybrid_jax pallas_kernels
# experiments`; ran on an H100; out-h100/remat-*: a second call, this tree's 340m row with
# `--remat none`, which the benchmark turns to full above 90 % of the card, beside mamba2-340m):
# the row session 45 scripted and never ran: oryx-mamba2-340m (scanned) training on
# packed WikiText-2 at T 8192, this tree (attention mode on the kernels, value slices) against
# 22ede88 (attention mode on the XLA rung, remat full: it needs most of the card without), and,
# on an H200 only, issue 14's transformer-125m row against the PyTorch peer (s37e's command).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; mkdir -p $OUT
bench() {  # NAME TREE EXTRA...
    local name=$1 tree=$2; shift 2
    (cd $tree && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m experiments.benchmarks.train_throughput \
        --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 8192 --models oryx-mamba2-340m --scan \
        --steps 5 "$@" --out $OUT/$name.json > $OUT/$name.log 2>&1)
    echo "== $name rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/$name.log | tail -6 | cut -c1-230
}
bench new .
bench old .old --remat full
case $gpu in *H200*) ;; *) echo "not an H200: issue 14's row not run"; exit 0 ;; esac
timeout 150 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 2048 --models transformer-125m --torch transformer-125m --unpacked transformer-125m \
    --steps 6 --out $OUT/train_125m.json > $OUT/train_125m.log 2>&1
echo "== 125m rc=$?"; grep -v "^W12\|^I12\|^E12\|^{" $OUT/train_125m.log | tail -8 | cut -c1-230
