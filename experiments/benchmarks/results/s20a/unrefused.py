"""op_kernels with the NHA API's refusal of the unchecked feature-tiled forms off (GPU checks of
the race fix only)."""
import runpy
import sys

import pallas_kernels.nha.api as api

api.REFUSE_UNCHECKED_FEATURE_TILES = False
sys.argv = ["op_kernels", *sys.argv[1:]]
runpy.run_module("experiments.benchmarks.op_kernels", run_name="__main__")
