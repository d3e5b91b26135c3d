#!/bin/bash
# Session 46, call c (carry .whl, .devdata, .old = `git archive fe43d6e hybrid_jax pallas_kernels
# experiments`): s46b's oryx-mamba2-130m rows, which timed out unscanned (compile), scanned at
# T 8192: this tree (attention-mode rows only) against fe43d6e (every row), one call. Further
# arguments go to train_throughput (s46d adds the unpacked rows).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1; mkdir -p $OUT
for t in new:. old:.old; do
    n=${t%%:*}; d=${t#*:}
    (cd $d && PYTHONPATH=/tmp/site:$PWD timeout 110 python3 -m experiments.benchmarks.train_throughput \
        --data /$OLDPWD/.devdata/wikitext2_bpe32k.npz --lengths 8192 --models oryx-mamba2-130m \
        --scan --torch "" --unpacked "" --steps 5 "$@" --out $OUT/$n.json > $OUT/$n.log 2>&1)
    echo "== $n rc=$?"; grep "^oryx" $OUT/$n.log | cut -c1-200
done
