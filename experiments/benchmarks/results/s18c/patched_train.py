"""train_throughput with session 18's two default-off options on (for one model row, before
they are defaults): SSD chunk_grads' summed score gradients, and the gated norm's backward at
8 warps over half the rows with joint sums (groups >= 1024). Usage: as train_throughput."""
import dataclasses
import sys

from experiments.benchmarks.train_throughput import main
from pallas_kernels.rms_norm import api as norm_api
from pallas_kernels.ssd import api as ssd_api

ssd_defaults, norm_defaults = ssd_api.default_block_sizes, norm_api.default_block_sizes
ssd_api.default_block_sizes = lambda *a, **kw: dataclasses.replace(
    ssd_defaults(*a, **kw), grads_summed_scores=True)


def norm_blocks(group_size, gated=False):
    b = norm_defaults(group_size, gated)
    if not (gated and group_size >= 1024):
        return b
    return dataclasses.replace(b, backward_block_rows=max(1, b.backward_block_rows // 2),
                               backward_steps=2 * b.backward_steps, backward_num_warps=8,
                               backward_joint_sums=True)


norm_api.default_block_sizes = norm_blocks
sys.exit(main(sys.argv[1:]))
