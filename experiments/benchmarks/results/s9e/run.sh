#!/bin/bash
# Session 9, call e (issue 14): transformer-350m unscanned without remat, on the machine call d
# left warm (gdn-340m's unscanned row), for the same-setting comparison.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
export PYTHONUNBUFFERED=1
timeout 150 python3 -m experiments.benchmarks.train_throughput --data .devdata/wikitext2_bpe32k.npz \
    --lengths 8192 --models transformer-350m --torch "" --unpacked "" --steps 4 --remat none \
    --no-scan --time-limit 140 --out $OUT/train_noscan_tf.json > $OUT/train_noscan_tf.log 2>&1
