"""The two combines of context parallelism, `all_gather` against `ppermute`, on fake devices.

    python -m experiments.benchmarks.context_parallel_combine [--devices 8] [--out results.json]

Times `incoming_states` (the cross-shard combine of per-shard affine maps, forward and
forward+backward) inside `jax.shard_map` for a diagonal map (an SSD-like state, batch 4 × 16
heads × 64 × 128, decay per head) and a dense one (a delta-rule state, 4 × 16 × 128 × 128,
K×K map), on 2, 4, ... D devices of one host. On CPU the "devices" share the host's cores, so
this measures the collective pattern's overhead, not an interconnect.
"""

from __future__ import annotations

import os
import sys


def _device_count(argv: list[str]) -> int:
    """`--devices N` (or `--devices=N`) from the command line, default 8."""
    for i, arg in enumerate(argv):
        if arg == "--devices" and i + 1 < len(argv):
            return int(argv[i + 1])
        if arg.startswith("--devices="):
            return int(arg.split("=", 1)[1])
    return 8


if "jax" not in sys.modules:  # fake CPU devices must be requested before jax is imported
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " "
                               f"--xla_force_host_platform_device_count={_device_count(sys.argv)}")

import argparse  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from experiments.benchmarks.timing import print_table, time_compiled, write_json  # noqa: E402
from experiments.cli import run_with_logging  # noqa: E402
from experiments.help_text import first_paragraph  # noqa: E402
from hybrid_jax.config import MeshConfig  # noqa: E402
from hybrid_jax.ops.context_parallel.collectives import (  # noqa: E402
    COMBINES,
    dense,
    diagonal,
    incoming_states,
)
from hybrid_jax.sharding import make_mesh  # noqa: E402

STATES = {  # name: (map shape per shard, state shape, apply)
    "diagonal": ((4, 16, 1, 1), (4, 16, 64, 128), diagonal),
    "dense": ((4, 16, 128, 128), (4, 16, 128, 128), dense),
}


def combine_fn(kind: str, combine: str, mesh):
    map_shape, state_shape, apply = STATES[kind]

    def local(maps, offsets):
        h = incoming_states(maps[0], offsets[0], jnp.zeros(state_shape), apply=apply,
                            combine=combine)
        return h[None]

    sharded = jax.shard_map(local, mesh=mesh, in_specs=(P("seq"), P("seq")),
                            out_specs=P("seq"), axis_names={"seq"})
    fwd = jax.jit(sharded)
    bwd = jax.jit(jax.grad(lambda m, u: jnp.sum(sharded(m, u)), argnums=(0, 1)))
    return fwd, bwd


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--devices", type=int, default=8,
                        help="the largest seq axis (fake CPU devices)")
    parser.add_argument("--out", default="context_parallel_combine.json")
    args = parser.parse_args()
    if args.devices < 2:  # one device has nothing to combine: no row to time
        parser.error(f"--devices must be at least 2, got {args.devices}")
    rows = []
    shards = 2
    while shards <= args.devices:
        mesh = make_mesh(MeshConfig(data=1, seq=shards), jax.devices()[:shards])
        for kind, (map_shape, state_shape, _) in STATES.items():
            key_m, key_u = jax.random.split(jax.random.key(shards))
            maps = jax.random.uniform(key_m, (shards,) + map_shape)
            offsets = jax.random.normal(key_u, (shards,) + state_shape)
            row = dict(shards=shards, map=kind)
            for combine in COMBINES:
                fwd, bwd = combine_fn(kind, combine, mesh)
                row[f"{combine}_fwd_ms"] = time_compiled(fwd, maps, offsets)
                row[f"{combine}_fwd_bwd_ms"] = time_compiled(bwd, maps, offsets)
            row["ppermute/all_gather fwd+bwd"] = (row["ppermute_fwd_bwd_ms"]
                                                  / row["all_gather_fwd_bwd_ms"])
            rows.append(row)
        shards *= 2
    print_table(rows, list(rows[0]))
    write_json(args.out, "context_parallel_combine", rows)


if __name__ == "__main__":
    run_with_logging(main)
