#!/bin/bash
# Session 31, call b (carry .whl, .devdata): transformer-125m, packed WikiText-2, T 2048, with XLA's
# command buffers (CUDA graphs) on (default) and off, three turns each in separate processes.
# Session 18 saw the untraced step at 69.3 ms (default) against 67.6 ms (off) once, within
# the spread of that call; issue 14's 45 % MFU target needs ≈ 5 ms of ≈ 66.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/logs
for turn in 1 2 3; do
  for mode in default off; do
    flags=""; [ $mode = off ] && flags="--xla_gpu_enable_command_buffer="
    XLA_FLAGS="$flags" timeout 90 python3 -m experiments.benchmarks.train_throughput \
        --data .devdata/wikitext2_bpe32k.npz --lengths 2048 --models transformer-125m \
        --torch "" --unpacked "" --steps 6 --out $OUT/tt125_${mode}_$turn.json \
        > $OUT/logs/tt125_${mode}_$turn.log 2>&1
    echo "$mode turn $turn rc=$? $(grep '^transformer' $OUT/logs/tt125_${mode}_$turn.log | cut -c1-160)"
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
