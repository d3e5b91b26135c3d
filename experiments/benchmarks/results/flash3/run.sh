#!/bin/bash
# Issue 14, round 3 (one device call, ≤ 7 min): the LM head's backward in bf16 (ops.logits), the
# cross entropy's one-pass backward (train/loss.py) and the swept flash-attention tiles
# (block_sizes.py). In order of importance, each under its own timeout:
#   1. the flash kernel's GPU accuracy check and the kernel table with the new defaults
#      (125m, d128, d256: cuDNN causal, kernel causal / packed)               ~2 min
#   2. full train steps at T 2048: the PyTorch peer, transformer-125m packed and unpacked,
#      transformer-350m packed (the headline ratio), then 125m unscanned on unpacked tokens
#      (cuDNN; the scan's cost: its per-layer update-slice fusions and memcpy128 look like
#      the residual stacking, ~13 ms of the 89 ms step in call 2)                  ~2.5 min
#   3. profile_step of transformer-125m packed: the TF32 gemms and the [tokens, vocab] loss
#      fusions should be gone                                                   ~45 s
#   4. the D128 kernels swept on one document per row (long documents, causal) and the
#      causal fwd+bwd with the swept blocks against cuDNN                       ~1.1 min
# Needs .devdata/wikitext2_bpe32k.npz (in the worktree; made on the dev machine by
# python -m experiments.benchmarks.packed_data ../shared/data/wikitext-2-raw/wiki.train.raw
# .devdata/wikitext2_bpe32k.npz) and the lead's wheels installed to /tmp/site before.
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/flash3}; mkdir -p $OUT
DATA=.devdata/wikitext2_bpe32k.npz
timeout 120 python3 -m experiments.benchmarks.flash_attention --parts check,table \
    --shapes 125m,d128,d256 --skip xla,swa --out $OUT/fa.json > $OUT/fa.log 2>&1
echo "flash check/table rc=$?"
timeout 165 python3 -m experiments.benchmarks.train_throughput --data $DATA --lengths 2048 \
    --models transformer-125m,transformer-350m --unpacked transformer-125m \
    --torch transformer-125m --unscanned transformer-125m --steps 10 --time-limit 135 \
    --out $OUT/tt.json > $OUT/tt.log 2>&1
echo "train_throughput rc=$?"
timeout 55 python3 -m experiments.benchmarks.profile_step --model transformer-125m \
    --length 2048 --data $DATA --modes packed --steps 5 --trace-dir /tmp/flash3_traces \
    --out $OUT/profile.json > $OUT/profile.log 2>&1
echo "profile rc=$?"
timeout 70 python3 -m experiments.benchmarks.flash_attention --parts sweep,table --shapes d128 \
    --documents causal --sweep-seconds 35 --skip xla,swa,packed \
    --out $OUT/fa_causal.json > $OUT/fa_causal.log 2>&1
echo "causal sweep rc=$?"
QUIET='^{\|^[EW][01][0-9]\|^ *%\|^This isn\|^If \|^Constant fold\|^Current\|^\*\|^$'
grep -v "$QUIET" $OUT/fa.log | tail -22
grep -v "$QUIET" $OUT/tt.log | tail -14
grep -v "$QUIET" $OUT/profile.log | tail -34
grep -v "$QUIET" $OUT/fa_causal.log | tail -40
