"""What one block's backward keeps, per token: the residuals autodiff saves between a block's
forward and its backward (no remat), summed by the function that made them.

    python -m experiments.benchmarks.block_residuals [--models gdn-340m,transformer-350m]
        [--layer 0] [--length 128] [--dtype bfloat16] [--top 12] [--out block_residuals.json]

Without remat this is the activation memory of a layer (× tokens per step × layers); under a
remat policy it is what the recompute writes and the backward reads back. Per-token arrays
only (`[B, T, ...]`; parameters and per-step constants are left out). It traces one block of
the preset (its width, heads and options; vocabulary 256) on random `[1, T, d_model]` inputs
with `jax.ad_checkpoint.print_saved_residuals`, so it runs anywhere, on the rungs the platform
picks: on a CPU the ops' XLA rungs, whose residuals differ from the Pallas kernels' (the rest
of the block — projections, convolutions, norms, gates — is the same everywhere).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import math
import re

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from experiments.benchmarks.timing import print_table, write_json
from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import presets
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.lm import create_model

_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "i32": 4, "bool": 1}
_RESIDUAL = re.compile(r"^\s*(\w+)\[([\d,]*)\]\s+(.*)$")


def block_residuals(name: str, layer: int = 0, length: int = 128, dtype: str = "bfloat16"
                    ) -> list[dict]:
    """Rows {source, dtype, bytes_per_token, arrays} of layer `layer` of preset `name`, the
    largest first; `source` is the function that made the array (or "argument")."""
    base = presets.get(name)
    config = base.replace(dtype=dtype, layers=base.layers[layer:layer + 1], vocab_size=256)
    block = create_model(config).blocks[0]
    graphdef, params, rest = nnx.split(block, nnx.Param, ...)
    x = jax.random.normal(jax.random.key(0), (1, length, config.d_model), jnp.dtype(dtype))
    context = TokenContext.create((1, length))

    def loss(x, params):
        return jnp.sum(nnx.merge(graphdef, params, rest)(x, context).astype(jnp.float32))

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(loss, x, params)
    sums = collections.defaultdict(lambda: [0.0, 0])
    for line in printed.getvalue().splitlines():
        match = _RESIDUAL.match(line)
        if not match:
            continue
        kind, dims, where = match.groups()
        shape = [int(d) for d in dims.split(",") if d]
        if shape[:2] != [1, length]:
            continue  # parameters, constants, per-step scalars
        function = re.search(r"\(([^()]*)\)\s*$", where)
        source = function.group(1) if function else ("argument" if "argument" in where
                                                      else where[:60])
        entry = sums[(source, kind)]
        entry[0] += _BYTES.get(kind, 4) * math.prod(shape[2:])
        entry[1] += 1
    rows = [{"source": s, "dtype": k, "bytes_per_token": b, "arrays": n}
            for (s, k), (b, n) in sums.items()]
    return sorted(rows, key=lambda r: -r["bytes_per_token"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--models", default="gdn-340m,mamba2-130m,nha-340m,transformer-350m")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--out", default="block_residuals.json")
    args = parser.parse_args(argv)
    results = []
    for name in args.models.split(","):
        rows = block_residuals(name, args.layer, args.length, args.dtype)
        total = sum(r["bytes_per_token"] for r in rows)
        print(f"\n{name}, layer {args.layer} ({jax.default_backend()} rungs): "
              f"{total / 1e3:.1f} KB a token kept for the backward")
        print_table([{**r, "KB_per_token": r["bytes_per_token"] / 1e3} for r in rows[:args.top]],
                    ["source", "dtype", "KB_per_token", "arrays"])
        results.append({"model": name, "layer": args.layer, "bytes_per_token": total,
                        "rows": rows})
    write_json(args.out, "block_residuals", results, length=args.length, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_with_logging(main))
