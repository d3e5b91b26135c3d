#!/bin/bash
# Session 22, call b (a's machine): mamba2-340m's step profiled on this tree and on .gpu/base.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
prof() {  # tree, out name, seconds
  (cd $1 && timeout $3 python3 -m experiments.benchmarks.profile_step --model mamba2-340m \
      --length 8192 --data $OLDPWD/.devdata/wikitext2_bpe32k.npz --modes packed --steps 3 \
      --remat none --out $OUT/$2.json > $OUT/$2.log 2>&1)
  echo "profile $2 rc=$?"; head -12 $OUT/$2.log | cut -c1-160
}
prof . profile_new 270
PYTHONPATH=/tmp/site:$PWD/.gpu/base prof .gpu/base profile_base 270
