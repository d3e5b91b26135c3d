"""The mixer shapes of the linear-op benchmarks: `--shapes` items → (op, `MixerShape`) jobs.

An item of the comma-separated `--shapes` (`linear_ops`, its fla peer, `op_kernels --shape`):

    BxT          H16, K = V = 128: the issue's shape (e.g. 4x8192)
    BxTxHxK      H heads, K = V = the last number
    BxTxHxKxV    H heads, keys K, values V (4x8192x3x256x512: gdn-340m's gated delta rule)
    MODEL@BxT    each op at the shape its layers have in the preset MODEL (`hybrid_jax.presets`),
                 e.g. gdn-340m@4x8192, nha-340m@4x8192, mamba2-130m@4x8192

What K and V are per op:
  gated_delta_rule         q, k `[B, T, H, K]`, v `[B, T, H, V]` (the kernels run V > 256 as
                           256-column slices)
  gated_slot_attention,    q, k `[.., K]`, v `[.., V]`, M slots (64 in the numeric forms)
  native_hybrid_attention
  ssd                      K is the state size N (B, C `[B, T, G, N]`), V the head dim P
                           (x `[B, T, H, P]`); G B/C groups (1 in the numeric forms)
  cuDNN causal attention   q, k, v all `[B, T, H, K]`: at V != K its v takes K too (one head
                           dim for all three; gdn-340m's V 512 is past cuDNN's 256)
A model shape reads each layer's mixer options: gdn (and oryx in GDN mode) give the gated delta
rule; mamba2 (oryx in Mamba-2 mode) SSD with its G and N; gsa GSA with its M; nha GSA (NHA at
window 0: its slot branch, what fla's `chunk_gsa` runs) and NHA itself (`op_kernels`). Asked
ops the model does not run are skipped (`shape_jobs` says which). Refused with a ValueError:
malformed items, dims after a model name (they come from the preset), a model running none of
the asked ops, a model whose layers give one op two shapes, NHA with grouped kv heads. M and G
other than 64 and 1 come only from a model shape.

Rows carry `MixerShape.fields(op)` (B, T, H, K, V; G for SSD, M for the slot ops);
`row_key` pairs ours, fla's and cuDNN's rows by them, so they pair only at one shape. A named
shape imports `hybrid_jax` (no JAX backend is started), the numeric forms import nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

OPS = ("ssd", "gated_delta_rule", "gated_slot_attention", "native_hybrid_attention")
SLOT_OPS = ("gated_slot_attention", "native_hybrid_attention")
ROW_FIELDS = ("B", "T", "H", "K", "V", "G", "M")
# The ops a layer of each mixer type runs (oryx: its linear mixer's).
MIXER_OPS = {"gdn": ("gated_delta_rule",), "mamba2": ("ssd",), "gsa": ("gated_slot_attention",),
             "nha": SLOT_OPS}
FORMS = "BxT, BxTxHxK, BxTxHxKxV or MODEL@BxT"


@dataclasses.dataclass(frozen=True)
class MixerShape:
    """One op's shape: batch, length, heads, key and value dims, SSD groups, GSA/NHA slots."""

    batch: int
    length: int
    heads: int = 16
    key_dim: int = 128
    value_dim: int = 128
    groups: int = 1
    slots: int = 64

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"MixerShape.{field.name}={value!r}: expected a positive "
                                 "integer")
        if self.heads % self.groups:
            raise ValueError(f"MixerShape: groups={self.groups} does not divide "
                             f"heads={self.heads}")

    def fields(self, op: str) -> dict[str, int]:
        """The row fields of `op` at this shape ("attention": cuDNN's, v at K)."""
        fields = dict(B=self.batch, T=self.length, H=self.heads, K=self.key_dim,
                      V=self.key_dim if op == "attention" else self.value_dim)
        if op == "ssd":
            fields["G"] = self.groups
        if op in SLOT_OPS:
            fields["M"] = self.slots
        return fields

    def label(self, op: str) -> str:
        return " ".join(f"{name}{value}" for name, value in self.fields(op).items())


def row_key(row: Mapping) -> tuple:
    """What pairs a row with another's: its op and shape fields (absent ones None)."""
    return (row.get("op"), *(row.get(name) for name in ROW_FIELDS))


def shape_jobs(text: str, ops: Sequence[str]) -> tuple[list[tuple[str, MixerShape]], list[str]]:
    """(op, shape) per item of the comma-separated `text` and per op of `ops`, in that order,
    each (op, shape) once; and a line per op a model shape skips (its model does not run it)."""
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        raise ValueError(f"ops {list(ops)}: expected some of {list(OPS)}")
    jobs, skipped, seen = [], [], set()
    for item in text.split(","):
        shapes = item_shapes(item, ops)
        skipped += [f"{item.strip()}: no {op} layer, not timed" for op in ops if op not in shapes]
        for op, shape in shapes.items():
            key = row_key({"op": op, **shape.fields(op)})
            if key not in seen:
                seen.add(key)
                jobs.append((op, shape))
    return jobs, skipped


def item_shapes(item: str, ops: Sequence[str]) -> dict[str, MixerShape]:
    """op → shape for one `--shapes` item (the module docstring's forms)."""
    model, at, dims = item.strip().rpartition("@")
    try:
        numbers = [int(n) for n in dims.split("x")]
    except ValueError:
        raise ValueError(f"shape {item!r}: expected {FORMS} (positive integers)") from None
    if at:
        if not model:
            raise ValueError(f"shape {item!r}: no model name before '@' (expected {FORMS})")
        if len(numbers) != 2:
            raise ValueError(f"shape {item!r}: a model shape takes BxT only, its heads and "
                             f"dims come from the preset {model!r}")
        found = model_shapes(model, *numbers)
        shapes = {op: found[op] for op in ops if op in found}
        if not shapes:
            raise ValueError(f"shape {item!r}: {model} runs none of {list(ops)} (its ops: "
                             f"{list(found)})")
        return shapes
    if len(numbers) not in (2, 4, 5):
        raise ValueError(f"shape {item!r}: expected {FORMS}, got {len(numbers)} numbers")
    if len(numbers) == 4:
        numbers.append(numbers[3])
    try:
        shape = MixerShape(*numbers)
    except ValueError as e:
        raise ValueError(f"shape {item!r}: {e}") from None
    return dict.fromkeys(ops, shape)


def model_shapes(model: str, batch: int, length: int) -> dict[str, MixerShape]:
    """op → shape of each op the preset `model`'s layers run (module docstring)."""
    from hybrid_jax import presets  # here: the numeric forms need no hybrid_jax (the fla peer)

    config = presets.get(model)
    found: dict[str, set[MixerShape]] = {}
    for index, spec in enumerate(config.layers):
        kind, options = spec.type, config.block_options(index)
        if kind == "oryx":
            kind, options = options.linear_mixer, options.linear_options()
        if kind in MIXER_OPS:
            shape = _mixer_shape(model, kind, options, config, batch, length)
            for op in MIXER_OPS[kind]:
                found.setdefault(op, set()).add(shape)
    for op, shapes in found.items():
        if len(shapes) > 1:
            raise ValueError(f"{model}: its {op} layers have {len(shapes)} shapes "
                             f"({sorted(s.label(op) for s in shapes)}); give each as BxTxHxKxV")
    return {op: next(iter(shapes)) for op, shapes in found.items()}


def _mixer_shape(model: str, kind: str, options, config, batch: int, length: int) -> MixerShape:
    if kind == "gdn":
        return MixerShape(batch, length, options.num_heads, options.key_dim(config),
                          options.value_dim(config))
    if kind == "mamba2":
        return MixerShape(batch, length, options.num_heads(config), options.state_size,
                          options.ssm_head_dim, groups=options.n_groups)
    if kind == "nha" and (options.num_kv_heads or options.num_heads) != options.num_heads:
        raise ValueError(f"{model}: NHA with {options.num_kv_heads} kv heads for "
                         f"{options.num_heads} query heads (GQA) has no benchmark shape")
    dim = options.head_dim or config.d_model // options.num_heads
    return MixerShape(batch, length, options.num_heads, dim, dim, slots=options.num_slots)
