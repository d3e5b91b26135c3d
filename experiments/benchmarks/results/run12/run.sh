#!/bin/bash
# Run 12 (one device call): "mixed" redefined (bf16 operands only in the backward's gradient
# products dq, dk̄, dv̄): accuracy check, then stage profile and table next to cuDNN.
B="python -m experiments.benchmarks.nha_kernel --windows 512"
$B --parts check,table --blocks mixed --lengths 8192,32768 --impls cudnn_causal,pallas_nha,cudnn_swa \
   --out $OUT/table.json 2>&1 | tee $OUT/table.log
$B --parts profile --lengths 8192 --profile-variants default,mixed:slot+whole \
   --out $OUT/profile.json 2>&1 | tee $OUT/profile.log
