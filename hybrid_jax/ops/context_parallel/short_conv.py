"""The context-parallel short convolution: the same call and result as the op."""

from __future__ import annotations

import functools

from hybrid_jax.ops.context_parallel.collectives import SEQ_AXIS, with_past
from hybrid_jax.ops.short_conv import short_conv as _short_conv


def short_conv(x, weight, bias=None, *, segment_ids=None, activation=False, head_channels=False,
               implementation=None, axis_name=SEQ_AXIS):
    """`hybrid_jax.ops.short_conv`, context-parallel: each time shard convolves with a halo of
    the K − 1 inputs (and segment ids) before it."""
    op = functools.partial(_short_conv, activation=activation, head_channels=head_channels,
                           implementation=implementation)

    def conv(seq, params):
        (x, ids), (weight, bias) = seq, params
        return op(x, weight, bias, segment_ids=ids)

    return with_past(conv, weight.shape[0] - 1, (x, segment_ids), (weight, bias),
                     axis_name=axis_name)
