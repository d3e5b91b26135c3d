#!/bin/bash
# Run 6 (one device call): v5 (grouped-load chunk scan, readout fast path, slot-input grads
# reordered): check and table, then each stage alone with tuning variants.
B="python -m experiments.benchmarks.nha_kernel --windows 512"
$B --parts check,table --lengths 8192,32768 --impls cudnn_causal,pallas_nha,cudnn_swa \
   --out $OUT/table.json 2>&1 | tee $OUT/table.log
$B --parts profile --lengths 8192 --out $OUT/profile.json \
   --profile-variants default,scan8:chunk_scan,scan32:chunk_scan,slot_w8:slot+whole,slot_bwd_w4:slot+whole \
   2>&1 | tee $OUT/profile.log
