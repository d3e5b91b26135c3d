#!/bin/bash
# Every Pallas GPU kernel against its float32 reference on the GPU (bf16 inputs unless a row says
# otherwise; packed documents and initial states where the op has them): the checks the kernels'
# NOTES quote, in one call. Run from the repo root:
#     bash experiments/benchmarks/gpu_checks.sh [KERNEL ...]
# KERNEL: logit_stats rms_norm short_conv ssd delta_rule nha flash_attention (default: all, in
# this order, ≈ 8 minutes on an H100 with the Triton cache cold). Writes KERNEL.log and
# KERNEL.json under $OUT (default runs/gpu_checks) and prints each check's verdict or table.
# Criteria: logit_stats, rms_norm, short_conv, ssd and delta_rule print "check: PASS" (every
# error < 1e-2); flash_attention's rows end in ok = True; nha prints its errors (the gate
# gradients of strong gates reach 0.03–0.09 by design: pallas_kernels/nha/NOTES.md, v6).
# ARCHIVE=1 packs the logs and JSONs into $OUT/gpu_checks.tgz instead (the device tool returns
# at most 8 files); with that tool, pip-install the carried wheels first (.library/device).
set -u
OUT=${OUT:-runs/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
KERNELS=("$@")
[ ${#KERNELS[@]} -eq 0 ] && KERNELS=(logit_stats rms_norm short_conv ssd delta_rule nha
                                     flash_attention)
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null

check() {  # KERNEL SECONDS LINES COMMAND...: run, keep the log, print its last LINES lines
    local kernel=$1 seconds=$2 lines=$3
    shift 3
    local start=$SECONDS
    timeout "$seconds" "$@" --out "$OUT/$kernel.json" > "$OUT/$kernel.log" 2>&1
    local rc=$?
    echo "== $kernel: rc=$rc, $((SECONDS - start)) s"
    grep -v "^[WIE][0-9]\{4\}\|^{" "$OUT/$kernel.log" | tail -"$lines" | cut -c1-200
}

for kernel in "${KERNELS[@]}"; do
    case $kernel in
        logit_stats) check "$kernel" 120 4 python3 -m experiments.benchmarks.logit_stats \
            --parts check ;;
        rms_norm) check "$kernel" 150 4 python3 -m experiments.benchmarks.rms_norm \
            --parts check ;;
        short_conv) check "$kernel" 150 4 python3 -m experiments.benchmarks.short_conv \
            --parts check ;;
        ssd) check "$kernel" 150 4 python3 -m experiments.benchmarks.linear_ops \
            --parts check --ops ssd --no-fla ;;
        delta_rule) check "$kernel" 150 4 python3 -m experiments.benchmarks.delta_rule_kernel \
            --check --budget-s 90 ;;
        nha) check "$kernel" 200 14 python3 -m experiments.benchmarks.nha_kernel \
            --check --check-variants "" ;;
        flash_attention) check "$kernel" 200 20 python3 -m experiments.benchmarks.flash_attention \
            --parts check ;;
        *) echo "unknown kernel $kernel: expected logit_stats rms_norm short_conv ssd delta_rule" \
                "nha flash_attention"; exit 2 ;;
    esac
done

if [ "${ARCHIVE:-0}" = 1 ]; then
    cd "$OUT" || exit 1
    shopt -s nullglob
    files=(*.log *.json)
    tar czf gpu_checks.tgz "${files[@]}" && rm -f "${files[@]}"
fi
