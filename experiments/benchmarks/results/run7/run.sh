#!/bin/bash
# Run 7 (one device call): v5 final (grouped-load chunk scan of K̃ and Ṽᵀ together, readout
# fast path): check, the whole table (XLA NHA at T8192 w512), the stage profile.
B="python -m experiments.benchmarks.nha_kernel"
$B --parts check,table --out $OUT/table.json 2>&1 | tee $OUT/table.log
$B --parts profile --lengths 8192 --windows 512 --out $OUT/profile.json 2>&1 | tee $OUT/profile.log
