#!/bin/bash
# Session 48 (one H100 came, asked for as nvidia-h200): s20b/run.sh as prepared, unchanged; carry .whl, .devdata.
export OUT=$OUT/s48b; mkdir -p $OUT; bash experiments/benchmarks/results/s20b/run.sh
