"""A CPU check of the GPU kernels for the shared-memory race of NHA session 19 (no GPU needed).

    python -m experiments.benchmarks.triton_races --triton-python VENV/bin/python
        [--cases nha-d128,nha-d256,...|all] [--out DIR]

The race (`pallas_kernels/nha/NOTES.md`, "The race"): Triton 3.6's pipeliner gave a tile that
one load feeds to both a register product and an asynchronous warp-group MMA fewer shared
buffers than the loop's stages, and let the MMA stay in flight while the next step's `cp.async`
overwrote the buffer: gradients 20–50 % wrong and different each run on an H200, while interpret
mode (no pipeliner) was right. What the check does, for each case:
1. `capture`: the fwd+bwd (`jax.vjp`) of the op at a model's shape lowered for CUDA on the CPU,
   each `pallas_call`'s Triton IR (TTIR) written with its launch parameters;
2. `compile_ttgir`: that IR through pip Triton's own passes for sm_90a up to TTGIR, where the
   pipeliner has placed the buffers and the waits (a Python with `triton` 3.6, e.g. a venv
   made with `pip install triton==3.6.0`: Triton is not a dependency of the library);
3. `in_flight_dots`: every async `warp_group_dot` reading a buffer allocated with fewer slots
   than the stages, and whether a `warp_group_dot_wait` retires it before the next copy into
   that buffer (retired when the async dots issued after it, before the wait, number at least
   the wait's `pendings`). "in flight" is the race. (The pipeliner issues a step's copies
   for the next step after its products, in the loop body: a copy placed before the dot
   would not be seen.)
Prints a line per kernel; exits 1 when a kernel has a dot in flight at a copy. The Triton
Python: `python3 -m venv /tmp/tvenv && /tmp/tvenv/bin/pip install triton==3.6.0`. Session 20
ran it over every case: only NHA's slot scores kernels before their fix had a dot in flight.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph

# --- 1. capture ------------------------------------------------------------------------------


def capture(fn: Callable, args: list, out_dir: Path) -> list[Path]:
    """Writes `NN_kernel.ttir` and `NN_kernel.json` (num_warps, num_stages) for each
    `pallas_call` of the fwd+bwd of `fn(*args)` (ShapeDtypeStructs) lowered for CUDA; returns
    the TTIR paths in order."""
    from jax._src.pallas.triton import lowering, pallas_call_registration

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    lower = lowering.lower_jaxpr_to_triton_module

    class Recording:  # the module's functions, with the one that makes the IR recorded
        def __getattr__(self, name):
            return getattr(lowering, name)

        def lower_jaxpr_to_triton_module(self, jaxpr, *rest, **kwargs):
            launch = sys._getframe(1).f_locals  # the caller's num_warps / num_stages
            module = lower(jaxpr, *rest, **kwargs)
            path = out_dir / f"{len(paths):02d}_{jaxpr.debug_info.func_name}.ttir"
            path.write_text(module.module.operation.get_asm(enable_debug_info=False))
            path.with_suffix(".json").write_text(json.dumps(
                {"num_warps": launch["num_warps"], "num_stages": launch["num_stages"]}))
            paths.append(path)
            return module

    def fwd_bwd(*x):
        out, vjp = jax.vjp(fn, *x)
        return vjp(jax.tree.map(jnp.ones_like, out))

    saved = pallas_call_registration.lowering
    pallas_call_registration.lowering = Recording()
    try:
        jax.jit(fwd_bwd).trace(*args).lower(lowering_platforms=("cuda",))
    finally:
        pallas_call_registration.lowering = saved
    return paths


def _spec(*shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype)


def _cases() -> dict[str, Callable[[], tuple[Callable, list]]]:
    """name → (fn, args): each kernel family at a model's shape, with packed documents, on
    the GPU defaults."""
    from pallas_kernels.delta_rule.api import gated_delta_rule
    from pallas_kernels.flash_attention.api import flash_attention
    from pallas_kernels.nha import api as nha
    from pallas_kernels.rms_norm.api import rms_norm
    from pallas_kernels.short_conv.api import short_conv
    from pallas_kernels.ssd.api import ssd

    B, T, f32 = 4, 8192, jnp.float32
    ids, starts = _spec(B, T, dtype=jnp.int32), _spec(B, T, dtype=jnp.bool_)

    def nha_case(H, D, window):
        fn = lambda q, k, v, s, g, i: nha.native_hybrid_attention(  # noqa: E731
            q, k, v, s, g, window=window, documents=nha.documents_from_segment_ids(i))
        return fn, [_spec(B, T, H, D)] * 3 + [_spec(B, T, H, 64, dtype=f32)] * 2 + [ids]

    def flash_case(H, D, window=None):
        fn = lambda q, k, v, i: flash_attention(q, k, v, i, window=window,  # noqa: E731
                                                implementation="gpu")
        return fn, [_spec(B, T, H, D)] * 3 + [ids]

    def gdn_case(H, K, V):
        fn = lambda q, k, v, g, b, s: gated_delta_rule(q, k, v, g, b, starts=s,  # noqa: E731
                                                       backend="gpu")[0]
        return fn, [_spec(B, T, H, K)] * 2 + [_spec(B, T, H, V)] + [_spec(B, T, H, dtype=f32)] * 2 \
            + [starts]

    def ssd_case(H, P):
        fn = lambda x, dt, a, b, c, i: ssd(x, dt, a, b, c, segment_ids=i,  # noqa: E731
                                           backend="gpu")[0]
        return fn, [_spec(B, T, H, P), _spec(B, T, H, dtype=f32), _spec(H, dtype=f32),
                    _spec(B, T, 1, 128), _spec(B, T, 1, 128), ids]

    def norm_case(C, group):
        fn = lambda x, w, z: rms_norm(x, w, z, group_size=group)  # noqa: E731
        return fn, [_spec(B * T, C), _spec(C, dtype=f32), _spec(B * T, C)]

    conv = lambda x, w, i: short_conv(x, w, None, i, activation=True)  # noqa: E731
    return {
        "nha-d128": functools.partial(nha_case, 16, 128, 512),  # issue 15's shape
        "nha-d256": functools.partial(nha_case, 4, 256, 32),  # nha-340m's layer
        "flash-d64": functools.partial(flash_case, 12, 64),
        "flash-d128": functools.partial(flash_case, 16, 128),
        "flash-d128-window": functools.partial(flash_case, 16, 128, 512),
        "flash-d256": functools.partial(flash_case, 4, 256),
        "gdn-k64": functools.partial(gdn_case, 16, 64, 64),
        "gdn-k128": functools.partial(gdn_case, 16, 128, 128),
        "gdn-k256": functools.partial(gdn_case, 3, 256, 512),  # gdn-340m's layer
        "ssd-p64": functools.partial(ssd_case, 32, 64),  # mamba2-340m's layer
        "ssd-p128": functools.partial(ssd_case, 16, 128),
        "norm-gated": functools.partial(norm_case, 2048, 1024),
        "conv": lambda: (conv, [_spec(B, T, 2048), _spec(4, 2048), ids]),
    }


# --- 2. compile to TTGIR (in a Python with pip Triton) ---------------------------------------

_TO_TTGIR = r"""
import json, sys
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget, Language
from triton.backends.nvidia.compiler import CUDABackend
backend = CUDABackend(GPUTarget("cuda", 90, 32))
for path in sys.argv[1:]:
    launch = json.load(open(path[:-len(".ttir")] + ".json"))
    options = backend.parse_options(launch)
    context = ir.context(); ir.load_dialects(context); backend.load_dialects(context)
    module = ir.parse_mlir_module(path, context); module.context = context
    stages, metadata = {}, {}
    backend.add_stages(stages, options, Language.TRITON)
    module = stages["ttgir"](stages["ttir"](module, metadata), metadata)
    open(path[:-len(".ttir")] + ".ttgir", "w").write(str(module))
"""


def compile_ttgir(paths: list[Path], triton_python: str) -> list[Path]:
    """The TTGIR of each TTIR file (sm_90a, its launch parameters), beside it."""
    subprocess.run([triton_python, "-c", _TO_TTGIR, *map(str, paths)], check=True)
    return [path.with_suffix(".ttgir") for path in paths]


# --- 3. the check ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finding:
    """An async dot at TTGIR line `line` reading a buffer of `slots` slots (fewer than the
    stages) that the next copy overwrites; `retired`: a wait retires the dot before it."""

    line: int
    slots: int
    retired: bool


_DEFINES = re.compile(r"(%[\w]+)(?:[:#]\w+)? = (.*)")
_ALLOC = re.compile(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x")
_VIEW = re.compile(r"ttg\.memdesc_(?:index|subslice|subview|trans|reshape) (%\w+)")


def in_flight_dots(ttgir: str, stages: int) -> list[Finding]:
    """The async `warp_group_dot`s of one kernel's TTGIR that read a shared buffer with fewer
    slots than `stages`, each with whether a wait retires it before the next
    `async_copy_global_to_local` into that buffer. A name stands for its latest definition:
    the printer reuses names only across regions that cannot see each other (e.g. the
    branches of an `scf.if`), each of which defines the name before using it."""
    names: dict[str, int] = {}  # SSA name → the id of its latest definition
    slots_of: dict[int, int] = {}  # buffer id → slots
    buffer_of: dict[int, int] = {}  # value id → the buffer it views
    dots, waits, copies = [], [], []  # (line, …)
    ids = itertools.count()

    for number, line in enumerate(ttgir.splitlines(), 1):
        text = line.strip()
        match = _DEFINES.match(text)
        body = match.group(2) if match else text
        operands = [names.get(name) for name in re.findall(r"%\w+", body.split("{")[0])]
        buffers = {buffer_of[o] for o in operands if o in buffer_of}
        if body.startswith("ttng.warp_group_dot ") and "isAsync = true" in body:
            dots.append((number, buffers))
        elif body.startswith("ttng.warp_group_dot_wait"):
            waits.append((number, int(re.search(r"pendings = (\d+)", body).group(1))))
        elif body.startswith("ttg.async_copy_global_to_local"):
            copies.append((number, buffers))
        if match:
            value = names[match.group(1)] = next(ids)
            alloc, view = _ALLOC.match(body), _VIEW.match(body)
            if alloc:
                buffer_of[value], slots_of[value] = value, int(alloc.group(1))
            elif view and names.get(view.group(1)) in buffer_of:
                buffer_of[value] = buffer_of[names[view.group(1)]]
    findings = []
    for line, buffers in dots:
        for buffer in buffers:
            if slots_of.get(buffer, stages) >= stages:
                continue
            copy = min((c for c, into in copies if c > line and buffer in into), default=None)
            if copy is None:
                continue
            later = [d for d, _ in dots if line < d < copy]
            retired = any(sum(d < w for d in later) >= pendings
                          for w, pendings in waits if line < w < copy)
            findings.append(Finding(line, slots_of[buffer], retired))
    return findings


def check(ttgir_paths: list[Path]) -> dict[str, list[Finding]]:
    """kernel file name → its findings."""
    result = {}
    for path in ttgir_paths:
        stages = json.loads(path.with_suffix(".json").read_text())["num_stages"]
        result[path.stem] = in_flight_dots(path.read_text(), stages)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--triton-python", required=True,
                        help="a Python with pip triton 3.6 (Triton's version in jaxlib 0.11)")
    parser.add_argument("--cases", default="all")
    parser.add_argument("--out", default="triton_races")
    args = parser.parse_args()
    cases = _cases()
    names = list(cases) if args.cases == "all" else args.cases.split(",")
    unknown = sorted(set(names) - set(cases))
    if unknown:
        parser.error(f"--cases: unknown {unknown}; expected all or some of {list(cases)}")
    from pallas_kernels import target

    target.platform = lambda: "gpu"  # the GPU kernels and defaults, lowered on this CPU
    races = 0
    for name in names:
        fn, specs = cases[name]()
        ttgir = compile_ttgir(capture(fn, specs, Path(args.out) / name), args.triton_python)
        for kernel, findings in check(ttgir).items():
            races += sum(not f.retired for f in findings)
            verdict = ", ".join(f"line {f.line}: {'retired' if f.retired else 'IN FLIGHT'}"
                                for f in findings) or "-"
            print(f"{name:18s} {kernel:45s} {verdict}")
    print("races:", races)
    sys.exit(1 if races else 0)


if __name__ == "__main__":
    run_with_logging(main)
