#!/bin/bash
# Session 46, call d (carry .whl, .devdata, .old = `git archive fe43d6e hybrid_jax pallas_kernels
# experiments`): unpacked random tokens, where cuDNN ran Oryx's attention over every row before
# and the flash kernel now runs only the attention-mode rows (cuDNN refuses active_queries):
# oryx-mamba2-130m scanned at T 8192, this tree against fe43d6e, one call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1; mkdir -p $OUT
for t in new:. old:.old; do
    n=${t%%:*}; d=${t#*:}
    (cd $d && PYTHONPATH=/tmp/site:$PWD timeout 100 python3 -m experiments.benchmarks.train_throughput \
        --data /$OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 8192 --models oryx-mamba2-130m \
        --scan --torch "" --unpacked oryx-mamba2-130m --steps 5 --out $OUT/$n.json > $OUT/$n.log 2>&1)
    echo "== $n rc=$?"; grep "oryx" $OUT/$n.log | grep -v WARN | tail -2 | cut -c1-200
done
