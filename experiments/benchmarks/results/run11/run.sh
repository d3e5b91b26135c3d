#!/bin/bash
# Run 11 (one device call): v5 as committed, the whole table and the accuracy check.
python -m experiments.benchmarks.nha_kernel --parts check,table --out $OUT/table.json \
   2>&1 | tee $OUT/table.log
