#!/bin/bash
# Session 18, call b: do XLA's command buffers (CUDA graphs) close the 4-7 % between the
# device time of a step and its wall time (s18a: transformer-125m 65.8 vs 68.6 ms,
# nha-340m 225.9 vs 236.8)? profile_step under three XLA_FLAGS; then mamba2-340m and
# transformer-350m on books (Gutenberg) at T 8192, the row session 17 left unmeasured.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
filt() { grep -v "^W12\|^If this\|^Current\|^\*\|^I12" "$@"; }
mkdir -p /tmp/j; trap 'tar czf $OUT/json.tgz -C /tmp/j .' EXIT
declare -A FLAGS=([default]="" [off]="--xla_gpu_enable_command_buffer="
  [all1]="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN --xla_gpu_graph_min_graph_size=1")
profile() {  # model, length, flags label, seconds
  XLA_FLAGS="${FLAGS[$3]}" timeout $4 python3 -m experiments.benchmarks.profile_step --model $1 \
      --length $2 --tokens 32768 --data .devdata/wikitext2_bpe32k.npz --modes packed --steps 3 \
      --remat none --top 12 --out /tmp/j/profile_$1_$3.json > $OUT/profile_$1_$3.log 2>&1
  echo "profile $1 $3 rc=$?"; filt $OUT/profile_$1_$3.log | grep "untraced\|device time\|rror" | sed 's/.*json.gz://' | cut -c1-200
}
profile transformer-125m 2048 default 70
profile transformer-125m 2048 off 70
profile transformer-125m 2048 all1 70
train() {  # model, seconds
  timeout $2 python3 -m experiments.benchmarks.train_throughput --data .devdata/gutenberg00_bpe32k.npz \
      --lengths 8192 --models $1 --torch "" --unpacked "" --steps 4 --remat none \
      --time-limit $(($2 - 5)) --out /tmp/j/books_$1.json >> $OUT/books.log 2>&1
  echo "books $1 rc=$?"; filt $OUT/books.log | grep "^$1\|^model" | tail -2 | cut -c1-250
}
train mamba2-340m 140
train transformer-350m 80
profile gdn-340m 8192 all1 100
