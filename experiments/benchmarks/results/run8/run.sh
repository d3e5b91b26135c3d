#!/bin/bash
# Run 8 (one device call): launch-parameter variants of the window backward at T32768 w512.
python -m experiments.benchmarks.nha_kernel --parts variants --lengths 32768 --windows 512 \
   --variants default,bwd_w8,bwd_w8_only,bwd_s3,dkv_k128,q64 --out $OUT/variants.json \
   2>&1 | tee $OUT/variants.log
