"""The fastest of an op_kernels run's variants, when it beats the control's fwd+bwd kernel time
by at least 2 %: prints its `train_throughput --kernel-changes` string (nothing otherwise).
Usage: python pick.py OP_KERNELS.json CONTROL_PASS 'LABEL=KERNEL:FIELD=VALUE,...' ..."""
import collections
import json
import sys

rows = json.load(open(sys.argv[1]))["rows"]
totals = collections.defaultdict(float)
for row in rows:
    totals[row["pass"]] += row["ms"]
control = totals[sys.argv[2]]
options = dict(arg.split("=", 1) for arg in sys.argv[3:])
times = {label: totals[f"fwd+bwd pallas ({label})"] for label in options
         if f"fwd+bwd pallas ({label})" in totals}
print(f"control {sys.argv[2]}: {control:.3f} ms; " + "; ".join(
    f"{label}: {ms:.3f}" for label, ms in times.items()), file=sys.stderr)
if times:
    best = min(times, key=times.get)
    if times[best] < 0.98 * control:
        print(options[best])
