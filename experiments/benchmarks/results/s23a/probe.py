"""Session 23, call a: nha-340m cut to 2 layers, profiled (packed WikiText-2, T 8192) with its
optimized HLO written out, to name what each fusion around the NHA kernels holds."""
import sys

import experiments.benchmarks.profile_step as ps
import experiments.benchmarks.train_throughput as tt

layers = int(sys.argv[1])
hlo_out = sys.argv[2]
base_config = tt.model_config
tt.model_config = lambda name: base_config(name).replace(layers=base_config(name).layers[:layers])

original_build = ps.build_step

def build_and_dump(*a, **k):
    built = original_build(*a, **k)
    with open(hlo_out, "w") as f:
        f.write(built.step.as_text())
    return built

ps.build_step = build_and_dump
sys.argv = [sys.argv[0]] + sys.argv[3:]
ps.main()
