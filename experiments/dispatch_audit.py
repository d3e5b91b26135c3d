"""Which implementation rung each op of a preset's training step takes on a GPU and on a TPU,
and why the faster rungs could not: the trainer's own step (forward, backward, optimizer) is
traced on abstract inputs for a faked platform, nothing runs or compiles.

    python -m experiments.dispatch_audit                       every preset, GPU and TPU
    python -m experiments.dispatch_audit gdn-340m pha-180m --platforms gpu --length 8192

The step is the one training runs (`hybrid_jax.train.trainer.make_train_step`): bfloat16
compute and float32 parameters (as the throughput benchmark trains), a packed batch (segment ids
and per-document positions, as `hybrid_jax.data.packing` writes them) and, for Oryx models, the
"random_chunks" mode schedule (both modes in every step). The platform is faked where every
rung reads it, `pallas_kernels.target.platform` (`hybrid_jax.ops.dispatch.backend` and the
kernels' own checks); every call the dispatcher runs is recorded (`traced_for`), the probes
`ops.attention_rung` makes are not. Tracing stays at the jaxpr: a GPU kernel is never lowered on
the CPU host. One line per preset, platform and op: the rung and, where the dispatcher passed
over faster ones, their reasons; a fallback to the XLA rung is marked "FALLBACK". Tiny presets
(head sizes of 8-16) fall back by design.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp

from experiments.cli import run_with_logging
from experiments.help_text import first_paragraph
from hybrid_jax import presets
from hybrid_jax.config import ExperimentConfig, MeshConfig, ModelConfig, ModeSchedule, TrainConfig
from hybrid_jax.data.mqar import MQARConfig
from hybrid_jax.ops import dispatch
from hybrid_jax.sharding import make_mesh
from hybrid_jax.train import trainer
from pallas_kernels import target

PLATFORMS = ("gpu", "tpu")


@dataclasses.dataclass(frozen=True, order=True)
class Choice:
    """One dispatched call: the op, the rung that ran, the faster rungs' reasons, the shapes
    (`(argument, shape, dtype)` each)."""

    op: str
    rung: str
    reasons: tuple[str, ...]
    shapes: tuple

    @property
    def fell_back(self) -> bool:
        """Whether it ran the XLA rung where a faster one was a candidate (the dispatcher
        logs it: a WARNING when that one was a kernel, INFO for another XLA form)."""
        return self.rung == "xla" and bool(self.reasons)


@contextlib.contextmanager
def traced_for(platform: str) -> Iterator[list[Choice]]:
    """Within: the target platform is `platform` ("gpu" / "tpu") and each call the dispatcher
    runs is appended to the list yielded. JAX's caches are cleared on entry, so no inner jit
    reuses a trace made for another platform."""
    choices: list[Choice] = []
    original_platform, original_choose = target.platform, dispatch.choose

    def choose(op, rungs, implementation, *args, **kwargs):
        rung, reasons = original_choose(op, rungs, implementation, *args, **kwargs)
        choices.append(Choice(op, rung.name, tuple(reasons), dispatch._shapes(args, kwargs)))
        return rung, reasons

    jax.clear_caches()
    target.platform = lambda: platform
    dispatch.choose = choose
    try:
        yield choices
    finally:
        target.platform, dispatch.choose = original_platform, original_choose


def training_config(name: str) -> ModelConfig:
    """Preset `name` as training runs it: bfloat16 compute, float32 parameters."""
    return presets.get(name).replace(dtype="bfloat16", param_dtype="float32")


def training_choices(config: ModelConfig, platform: str, *, batch: int = 2,
                     length: int = 2048) -> list[Choice]:
    """The distinct dispatched calls of one training step of `config` on `platform`, sorted."""
    experiment = ExperimentConfig(name="dispatch_audit", model=config, data=MQARConfig(),
                                  train=TrainConfig(batch_size=batch, steps=10, warmup_steps=1))
    mesh = make_mesh(MeshConfig())
    # The trainer's shapes-only model and optimizer (no initialisation runs).
    abstract = trainer._abstract_train_state(experiment, mesh)
    state = trainer.TrainState(abstract.graphdef, abstract.state, abstract.shardings, mesh)
    oryx = any(spec.type == "oryx" for spec in config.layers)
    step = trainer.make_train_step(state, modes=ModeSchedule(pattern="random_chunks")
                                   if oryx else None)
    tokens = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    packed = {"inputs": tokens, "targets": tokens, "segment_ids": tokens, "positions": tokens,
              "mask": jax.ShapeDtypeStruct((batch, length), jnp.bool_)}
    with traced_for(platform) as choices, jax.set_mesh(mesh):
        jax.eval_shape(step, abstract.state, packed)
    return sorted(set(choices))


def describe(choice: Choice) -> str:
    line = f"{choice.op}: {choice.rung}"
    if choice.reasons:
        line += f" ({'; '.join(choice.reasons)})"
    return ("FALLBACK " if choice.fell_back else "") + line


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("presets", nargs="*", help="preset names (default: all)")
    parser.add_argument("--platforms", default=",".join(PLATFORMS),
                        help="comma-separated, of gpu and tpu (default: both)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    args = parser.parse_args(argv)
    for name in args.presets or presets.names():
        for platform in args.platforms.split(","):
            start = time.perf_counter()
            choices = training_choices(training_config(name), platform, batch=args.batch,
                                       length=args.length)
            print(f"{name} {platform} ({time.perf_counter() - start:.1f} s)", flush=True)
            seen = set()
            for choice in choices:  # one line per (op, rung, reasons): shapes differ
                line = describe(choice)
                if line not in seen:
                    seen.add(line)
                    print(f"    {line}", flush=True)


if __name__ == "__main__":
    run_with_logging(main)
