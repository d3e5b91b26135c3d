"""Session 22, call c: which dots XLA (GPU) merges in a 2-layer mamba2-340m-shaped step, and the
slices / concatenates around them, for Mamba-2's B/C/dt product as written in the session's
uncommitted change ("bf16": `Mamba2Mixer._bcdt_proj`, one product of the concatenated kernels;
BENCHMARKS.md, session 22), with a float32 output and compute-dtype backward (`ops.logits`,
"f32"), and on the committed tree ("base", run from .gpu/base)."""
import re
import sys

import jax

import experiments.benchmarks.train_throughput as tt
from experiments.benchmarks.train_throughput import build_step
from hybrid_jax import ops
from hybrid_jax.nn import mamba2


def f32_bcdt(self, x_BTD):
    kernels = [p.kernel[...].reshape(x_BTD.shape[-1], -1)
               for p in (self.b_proj, self.c_proj, self.dt_proj)]
    return ops.logits(x_BTD, jax.numpy.concatenate(kernels, axis=1), vocab_axis=1,
                      dtype=self.dt_proj.dtype)


variant = sys.argv[1]
if variant == "f32":
    mamba2.Mamba2Mixer._bcdt_proj = f32_bcdt
base_config = tt.model_config
tt.model_config = lambda name: base_config(name).replace(layers=base_config(name).layers[:2])
built = build_step("mamba2-340m", 8192, tokens=32768, data=sys.argv[2], remat="none",
                   scan=False, packed=True)
txt = built.step.as_text()
big = re.compile(r"\[(4,8192|32768),(2336|2304|2048|4384|288|256)[\],]")
for line in txt.splitlines():
    s = line.strip()
    if ("dot(" in s or "custom-call" in s and "gemm" in s or " slice(" in s
            or "concatenate(" in s) and (big.search(s) or "2336" in s or "4384" in s):
        print(s[:260])
