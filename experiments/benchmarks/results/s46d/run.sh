#!/bin/bash
# Session 46, call d (carry .whl, .devdata, .old = `git archive fe43d6e hybrid_jax pallas_kernels
# experiments`): s46c's rows with unpacked random tokens added, where fe43d6e ran Oryx's
# attention on cuDNN over every row and the measured tree (c209c1d, cuDNN then refusing
# active_queries) on the flash kernel over the attention-mode rows. Since 15f8d60 cuDNN takes
# the flags, so this tree's unpacked row runs cuDNN again. (Run as a copy of s46c's loop, with
# `timeout 100`.)
bash experiments/benchmarks/results/s46c/run.sh --unpacked oryx-mamba2-130m
