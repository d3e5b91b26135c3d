#!/bin/bash
# Session 22, call c: the dots XLA merges around Mamba-2's B/C/dt product (hlo_probe.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
for v in bf16 f32; do
  timeout 150 python3 experiments/benchmarks/results/s22c/hlo_probe.py $v .devdata/wikitext2_bpe32k.npz > $OUT/probe_$v.log 2>&1
  echo "probe $v rc=$?"; grep -v "^W12\|^I12" $OUT/probe_$v.log | head -60 | cut -c1-230
done
(cd .gpu/base && PYTHONPATH=/tmp/site:$PWD timeout 150 python3 $OLDPWD/experiments/benchmarks/results/s22c/hlo_probe.py base $OLDPWD/.devdata/wikitext2_bpe32k.npz > $OUT/probe_base.log 2>&1)
echo "probe base rc=$?"; grep -v "^W12\|^I12" $OUT/probe_base.log | head -60 | cut -c1-230
