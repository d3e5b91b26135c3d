#!/bin/bash
# Session 48 (one H100 came, asked for as nvidia-h200): s47c/run.sh as prepared, unchanged; carry .whl, .devdata.
export OUT=$OUT/s48c; mkdir -p $OUT; bash experiments/benchmarks/results/s47c/run.sh
