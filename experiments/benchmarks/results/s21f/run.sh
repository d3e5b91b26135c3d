#!/bin/bash
# Session 21, call f (follow-up of e on its machine): nha-hybrid-340m with call e's swept D 256
# flash-attention tiles (e's script read the sweep's JSON under the wrong key and skipped this),
# then with today's again.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
train() {  # out name, extra args
  timeout 240 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
      --lengths 8192 --models nha-hybrid-340m --torch "" --unpacked "" --steps 4 --remat none \
      --out $OUT/$1.json "${@:2}" > $OUT/$1.log 2>&1
  echo "train $1 rc=$?"; filt $OUT/$1.log | grep -v "^{" | tail -2 | cut -c1-200
}
train hybrid_swept --kernel-changes "flash_attention:block_k=32,num_stages=2,dq_num_stages=3,diagonal_causal_only=True"
train hybrid_today2
