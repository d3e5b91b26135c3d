#!/bin/bash
# Session 48 (one H100 came, asked for as nvidia-h200): s20h/run.sh as prepared, unchanged; carry .whl, .devdata.
export OUT=$OUT/s48a; mkdir -p $OUT; bash experiments/benchmarks/results/s20h/run.sh
