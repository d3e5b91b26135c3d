#!/bin/bash
# Run 10 (one device call): is the exact (sub-chunk) branch of the slot kernels costing the
# fast path? Stage profile as committed, then with every lax.cond in chunk_math replaced by
# its fast branch (an experiment on the device's copy only: wrong for strong gates).
B="python -m experiments.benchmarks.nha_kernel --parts profile --lengths 8192 --windows 512"
$B --profile-variants default --out $OUT/profile.json 2>&1 | tee $OUT/profile.log
sed -i 's/lax\.cond(/_fast_branch_only(/' pallas_kernels/nha/chunk_math.py
printf '\n\ndef _fast_branch_only(pred, fast, exact):\n    return fast()\n' >> pallas_kernels/nha/chunk_math.py
grep -c _fast_branch_only pallas_kernels/nha/chunk_math.py
$B --profile-variants default --out $OUT/profile_fast_only.json 2>&1 | tee $OUT/profile_fast_only.log
