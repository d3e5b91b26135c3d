"""Warm-up workers for a Triton peer's autotuning (torch-free, so `linear_ops` can import it).

fla autotunes each kernel over up to ~50 configs on its first call, compiling every one on the
CPU, one after another: minutes for `chunk_gsa`. n workers, worker i restricted to the configs
i, i + n, ... of each kernel, compile them all into a shared Triton cache in parallel; the
measured run then autotunes over every config as usual, from compiled kernels.
"""

from __future__ import annotations

WARM_VARIABLE = "FLA_PEER_WARM"  # "i/n" in a worker's environment


def restrict_autotuning(part: str) -> None:
    """Makes this process worker i of n (`part` "i/n"): Triton's autotuner keeps the configs
    i, i + n, ... of each kernel (config i mod their number when it has fewer than n)."""
    from triton.runtime import autotuner

    index, count = (int(x) for x in part.split("/"))
    if not 0 <= index < count:
        raise ValueError(f"{WARM_VARIABLE}: expected i/n with 0 <= i < n, found {part!r}")
    prune = autotuner.Autotuner.prune_configs

    def slice_of(self, *args, **kwargs):
        configs = prune(self, *args, **kwargs)
        return configs[index::count] or [configs[index % len(configs)]]

    autotuner.Autotuner.prune_configs = slice_of
