#!/bin/bash
# Run 5 (one device call): check and table with the closed-form state pass (default), then
# every stage alone with the state-pass variants, then the table with the grouped-load scan.
B="python -m experiments.benchmarks.nha_kernel --windows 512"
$B --parts check,table --lengths 8192,32768 --impls cudnn_causal,pallas_nha,cudnn_swa \
   --out $OUT/table.json 2>&1 | tee $OUT/table.log
$B --parts profile --lengths 8192 --out $OUT/profile.json \
   --profile-variants default,v4:chunk_states,scan16:chunk_states+whole,scan16_t32:chunk_states,closed8:chunk_states,closed32:chunk_states \
   2>&1 | tee $OUT/profile.log
$B --parts table --lengths 8192,32768 --impls pallas_nha --blocks scan16 \
   --out $OUT/table_scan16.json 2>&1 | tee $OUT/table_scan16.log
