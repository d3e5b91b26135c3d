#!/bin/bash
# Run 9 (one device call): 64-row query blocks with 4 warps as the default (run 8): window
# variants at T32768, then check and table at T8192 and T32768, cuDNN beside it.
B="python -m experiments.benchmarks.nha_kernel --windows 512"
$B --parts variants --lengths 32768 --variants q64_k128,q64_w8,q64_s2 --out $OUT/variants.json \
   2>&1 | tee $OUT/variants.log
$B --parts check,table --lengths 8192,32768 --impls cudnn_causal,pallas_nha,cudnn_swa \
   --out $OUT/table.json 2>&1 | tee $OUT/table.log
