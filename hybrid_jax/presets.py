"""Named model configurations. `names()` lists them; `get(name)` returns a `ModelConfig`.

Tiny presets (name contains "tiny") train in minutes on a CPU; the others are the paper-scale
shapes. Each block type adds at least one tiny preset.
"""

from __future__ import annotations

from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.registry import Registry

PRESETS = Registry("preset")


def register(name: str, description: str = ""):
    """Decorator registering a zero-argument function that returns a ModelConfig."""
    return PRESETS.decorator(name, description)


def names() -> list[str]:
    return PRESETS.names()


def describe(name: str) -> str:
    return PRESETS.describe(name)


def get(name: str) -> ModelConfig:
    return PRESETS.get(name)()


@register("transformer-125m")
def transformer_125m() -> ModelConfig:
    """GPT-2-small shape: 12 layers, d_model 768, 12 heads, tied embeddings (~124M params)."""
    return ModelConfig(layers=("attention",) * 12, vocab_size=50304, d_model=768, num_heads=12,
                       ffn_dim=2048)


@register("transformer-350m")
def transformer_350m() -> ModelConfig:
    """24 layers, d_model 1024, 16 heads of 64, SwiGLU 2816, tied embeddings, a 32000
    vocabulary (~341M params): the transformer of the 340m comparisons (gdn-340m, nha-340m,
    mamba2-340m, oryx-*-340m)."""
    return ModelConfig(layers=("attention",) * 24, vocab_size=32000, d_model=1024, num_heads=16,
                       ffn_dim=2816)


@register("llama-40m")
def llama_40m() -> ModelConfig:
    """Llama-shaped ~40M: 8 layers, d_model 512, 8 heads of 64 sharing 4 kv heads (GQA),
    SwiGLU 1408, RoPE, RMSNorm, untied embeddings, vocab 16384 (exports as LlamaForCausalLM)."""
    return ModelConfig(layers=("attention",) * 8, vocab_size=16384, d_model=512, num_heads=8,
                       num_kv_heads=4, ffn_dim=1408, tie_embeddings=False)


@register("transformer-tiny")
def transformer_tiny() -> ModelConfig:
    """2-layer, d_model 64 transformer on a byte vocabulary, for CPU runs and tests."""
    return ModelConfig(layers=("attention",) * 2, vocab_size=256, d_model=64, num_heads=4)


@register("swa-transformer-tiny")
def swa_transformer_tiny() -> ModelConfig:
    """transformer-tiny with 16-token sliding-window attention and grouped-query heads."""
    return ModelConfig(layers=("attention",) * 2, vocab_size=256, d_model=64, num_heads=4,
                       num_kv_heads=2, window=16)


# Mamba-2 layers of the tiny presets: 8 heads of 16 channels (d_inner 128), state size 16;
# 16-token chunks are the fastest SSD chunk size on CPU at these widths.
_MAMBA2_TINY = layer("mamba2", ssm_head_dim=16, state_size=16, chunk_size=16)


@register("mamba2-tiny")
def mamba2_tiny() -> ModelConfig:
    """4 Mamba-2 layers, d_model 64, no FFN (as in Mamba-2), for CPU runs and tests."""
    return ModelConfig(layers=(_MAMBA2_TINY,) * 4, vocab_size=256, d_model=64, ffn_dim=0)


@register("mamba2-hybrid-tiny")
def mamba2_hybrid_tiny() -> ModelConfig:
    """Mamba-2 then attention (each with a SwiGLU FFN), d_model 64: a tiny hybrid."""
    return ModelConfig(layers=(_MAMBA2_TINY, "attention"), vocab_size=256, d_model=64,
                       num_heads=4)


@register("mamba2-130m")
def mamba2_130m() -> ModelConfig:
    """Mamba-2 130M: 24 layers, d_model 768, expand 2, head dim 64, state 128 (~129M params).

    Like Mamba-2 it has no FFN (`ffn_dim=0`): each block is norm → mixer → residual.
    """
    return ModelConfig(layers=(layer("mamba2", ssm_head_dim=64, state_size=128),) * 24,
                       vocab_size=50304, d_model=768, ffn_dim=0)


@register("mamba2-340m")
def mamba2_340m() -> ModelConfig:
    """Mamba-2 ~350M: 48 layers, d_model 1024, expand 2, head dim 64, state 128, no FFN.

    Depth and width are the Mamba-2 paper's 370M model; the 32000 vocabulary is the other
    340m presets' (the paper's is GPT-NeoX's 50280).
    """
    return ModelConfig(layers=(layer("mamba2", ssm_head_dim=64, state_size=128),) * 48,
                       vocab_size=32000, d_model=1024, ffn_dim=0)


@register("gss-tiny")
def gss_tiny() -> ModelConfig:
    """2 GSS layers, d_model 64 (gate width 256, DSS width 16, 32 modes), no FFN as in GSS."""
    return ModelConfig(layers=(layer("gss", state_size=32),) * 2, vocab_size=256, d_model=64,
                       ffn_dim=0)


# Linear-mixer layers of the tiny presets: 16-token chunks train several times faster than 64
# on CPU at these widths (smaller triangular solves / fewer slot-decay levels per chunk).
_GDN_TINY = layer("gdn", chunk_size=16)
_GSA_TINY = layer("gsa", num_slots=16, chunk_size=16)


@register("gdn-tiny")
def gdn_tiny() -> ModelConfig:
    """2 Gated DeltaNet layers, d_model 64, 4 heads (key 16, value 32), for CPU runs and tests."""
    return ModelConfig(layers=(_GDN_TINY,) * 2, vocab_size=256, d_model=64, num_heads=4)


@register("gdn-hybrid-tiny")
def gdn_hybrid_tiny() -> ModelConfig:
    """Gated DeltaNet then attention (each with a SwiGLU FFN), d_model 64: a tiny hybrid."""
    return ModelConfig(layers=(_GDN_TINY, "attention"), vocab_size=256, d_model=64,
                       num_heads=4)


@register("gdn-130m")
def gdn_130m() -> ModelConfig:
    """Gated DeltaNet ~131M: oryx-gdn-130m's shape without the attention query: 12 layers,
    d_model 768, 12 heads of 64 (values of 64: expand_v 1), SwiGLU FFN 2048."""
    return ModelConfig(layers=(layer("gdn", expand_v=1),) * 12, vocab_size=50304, d_model=768,
                       num_heads=12, ffn_dim=2048)


@register("gdn-340m")
def gdn_340m() -> ModelConfig:
    """Gated DeltaNet ~347M: 21 layers, d_model 1024, 3 heads of 256 (values 512), FFN 2816.

    Layers, width, head size 256, expand_v 2 and the FFN width (fla's hidden_ratio 4) follow
    flame's `gated_deltanet_340M.json`; 3 heads instead of its 6 keep fla's budget of q/k
    0.75·d and v/gate/out 1.5·d (6·d² per mixer; 6 heads would make it ~460M). Tied
    embeddings and a 32000 vocabulary (Llama-2's) are our choice.
    """
    return ModelConfig(layers=("gdn",) * 21, vocab_size=32000, d_model=1024, num_heads=3,
                       head_dim=256, ffn_dim=2816)


@register("gsa-tiny")
def gsa_tiny() -> ModelConfig:
    """2 Gated Slot Attention layers, d_model 64, 4 heads of 16 with 16 slots each."""
    return ModelConfig(layers=(_GSA_TINY,) * 2, vocab_size=256, d_model=64, num_heads=4)


@register("gsa-hybrid-tiny")
def gsa_hybrid_tiny() -> ModelConfig:
    """Gated Slot Attention (16 slots) then attention, d_model 64: a tiny hybrid."""
    return ModelConfig(layers=(_GSA_TINY, "attention"), vocab_size=256, d_model=64,
                       num_heads=4)


# NHA layers of the tiny presets: 16 slots per head; the model-level `window` (16) applies to
# every NHA layer that does not set its own, so `--set model.window=...` sweeps them. 16-token
# chunks are the fastest on CPU at these widths (about 1.7x faster than 64 for a train step).
_NHA_TINY = layer("nha", num_slots=16, chunk_size=16)


@register("nha-tiny")
def nha_tiny() -> ModelConfig:
    """2 NHA layers, d_model 64, 4 heads of 16, 16 slots each and a 16-token window."""
    return ModelConfig(layers=(_NHA_TINY,) * 2, vocab_size=256, d_model=64, num_heads=4,
                       window=16)


@register("nha-hybrid-tiny")
def nha_hybrid_tiny() -> ModelConfig:
    """NHA (16 slots, 16-token window) then NHA with a full window (causal attention), d 64."""
    return ModelConfig(layers=(_NHA_TINY, layer("nha", num_slots=16, chunk_size=16, window=None)),
                       vocab_size=256, d_model=64, num_heads=4, window=16)


def _nha_340m(layers: tuple) -> ModelConfig:
    return ModelConfig(layers=layers, vocab_size=32000, d_model=1024, num_heads=4, ffn_dim=2816,
                       window=32, tie_embeddings=False)


@register("nha-340m")
def nha_340m() -> ModelConfig:
    """NHA ~380M: 24 layers, d_model 1024, 4 heads of 256, 64 slots, window 32, FFN 2816.

    Width, depth, heads, slots and window are the paper's 340M setting; τ = 8, no short convs,
    untied embeddings, a 32000 vocabulary and FFN 2816 (fla's hidden_ratio 4) follow JusenD/NHA's
    config defaults. Our choices: empty slots are masked (the original code lets them act as
    zero-value sinks: `empty_slots="sink"`), the swish feature map on the slot branch (GSA's;
    commented out in the original layer) and normal(0.02) initialisation.
    """
    return _nha_340m((layer("nha"),) * 24)


@register("nha-hybrid-340m")
def nha_hybrid_340m() -> ModelConfig:
    """nha-340m with a full window (causal attention) in every 6th layer (5, 11, 17, 23).

    The original code widens the window of layer i to 2048 when i % block_size ==
    transformer_idx; one layer in six, the last of each group, is our choice.
    """
    return _nha_340m(tuple(layer("nha", window=None) if i % 6 == 5 else layer("nha")
                           for i in range(24)))


# PHA (the parallel hybrid block, hybrid_jax/nn/pha.py). Sizes are ours: the paper gives only
# the parameter counts (90M / 125M / 180M on WikiText-103 with GPT-2's tokenizer); heads of
# 64 and d_model // 256 key/value heads: 4 query heads per key/value head (pha-125m: 5, its 10
# heads over 2).
_PHA_ATTENTION = layer("attention", cosine=True)
_PHA_GSS = layer("gss", expansion=2, state_size=64)
_PHA_SIZES = {"90m": (512, 14), "125m": (640, 13), "180m": (768, 14), "tiny": (32, 2)}
PHA_ABLATIONS = {
    "sequential": dict(layout="sequential", branch_norm=False, mixing="sum"),
    # The same serial stack with pre-norm residuals: at the Gutenberg ablation's learning rate
    # (2e-3) the DeepNorm serial stack (30 post-norm sublayers) diverged.
    "sequential-prenorm": dict(layout="sequential", branch_norm=False, mixing="sum",
                               residual="pre_norm"),
    "no-attention": dict(branches=(_PHA_GSS, "dual_ffn")),
    "no-gss": dict(branches=(_PHA_ATTENTION, "dual_ffn")),
    "no-ffn-aux": dict(branches=(_PHA_GSS, _PHA_ATTENTION, "ffn")),
    "fixed-mixing": dict(mixing="fixed"),
}


def pha_config(size: str, **block_options) -> ModelConfig:
    """A PHA model of one of `_PHA_SIZES` ("tiny": d_model 32, 2 layers, byte vocabulary)."""
    d, depth = _PHA_SIZES[size]
    if size != "tiny":
        return pha_model(d, depth, **block_options)
    # A small GSS and a 4-token window keep the CPU tests fast and windowed.
    block = layer("pha", **{"branches": (layer("gss", expansion=2, state_size=8),
                                         layer("attention", cosine=True, window=4),
                                         "dual_ffn"), **block_options})
    return ModelConfig(layers=(block,) * depth, vocab_size=256, d_model=d, num_heads=4,
                       num_kv_heads=2)


def pha_model(d_model: int, depth: int, *, vocab_size: int = 50304,
              num_kv_heads: int | None = None, **block_options) -> ModelConfig:
    """`depth` PHA blocks of width `d_model`: heads of 64, `num_kv_heads` key/value heads
    (None: d_model // 256)."""
    return ModelConfig(layers=(layer("pha", **block_options),) * depth, vocab_size=vocab_size,
                       d_model=d_model, num_heads=d_model // 64,
                       num_kv_heads=num_kv_heads or max(1, d_model // 256))


def attention_only_model(d_model: int, depth: int, ffn_dim: int, *, vocab_size: int = 50304,
                         num_kv_heads: int | None = None) -> ModelConfig:
    """PHA's baseline: pre-norm GQA attention → SwiGLU blocks, heads of 64, `num_kv_heads`
    (None: d_model // 256); `ffn_dim` matches the parameter count of a PHA model."""
    return ModelConfig(layers=("attention",) * depth, vocab_size=vocab_size, d_model=d_model,
                       num_heads=d_model // 64, num_kv_heads=num_kv_heads or max(1, d_model // 256),
                       ffn_dim=ffn_dim)


def _register_pha() -> None:
    for size in _PHA_SIZES:
        name = "pha-tiny" if size == "tiny" else f"pha-{size}"
        d, depth = _PHA_SIZES[size]
        register(name, f"PHA: {depth} parallel GSS ‖ GQA ‖ Dual-FFN blocks, d_model {d}, "
                 "DeepNorm")(lambda size=size: pha_config(size))
    for ablation, options in PHA_ABLATIONS.items():
        for size, suffix in (("180m", ""), ("tiny", "-tiny")):
            if size == "tiny" and "branches" in options:
                options = {**options, "branches": tuple(
                    layer("gss", expansion=2, state_size=8) if b == _PHA_GSS else
                    layer("attention", cosine=True, window=4) if b == _PHA_ATTENTION else b
                    for b in options["branches"])}
            register(f"pha-{ablation}{suffix}", f"PHA ablation ({ablation}) of pha-{size}")(
                lambda size=size, options=options: pha_config(size, **options))


_register_pha()


@register("attention-only-180m")
def attention_only_180m() -> ModelConfig:
    """The paper's baseline for pha-180m: pre-norm GQA transformer of matched size."""
    return attention_only_model(768, 14, ffn_dim=3776)


@register("attention-only-tiny")
def attention_only_tiny() -> ModelConfig:
    """attention-only-180m's shape at pha-tiny's width and depth (4-token window)."""
    return ModelConfig(layers=(layer("attention", window=4),) * 2, vocab_size=256, d_model=32,
                       num_heads=4, num_kv_heads=2, ffn_dim=176)


@register("oryx-gdn-tiny")
def oryx_gdn_tiny() -> ModelConfig:
    """2 Oryx layers (attention ‖ Gated DeltaNet per token), d_model 64, 4 heads of 16.

    Shared by both modes (`hybrid_jax.nn.oryx.shared_fraction`): 85.7 % of each block's
    parameters (W_K, W_V, W_G, W_O, convs, norms, FFN), 87.4 % of the model's with the
    embeddings; each mode owns its W_Q, the linear mode its β / decay parameters.
    Baselines of the same size: transformer-tiny, gdn-tiny.
    """
    return ModelConfig(layers=(layer("oryx", chunk_size=16),) * 2, vocab_size=256, d_model=64,
                       num_heads=4)


@register("oryx-gdn-130m")
def oryx_gdn_130m() -> ModelConfig:
    """12 Oryx-GDN layers, d_model 768, 12 heads of 64, SwiGLU FFN 2048 (~138M params).

    Shared by both modes: 85.5 % of each block, 89.6 % of the model with the embeddings.
    Baselines: transformer-125m, gdn-130m (this shape without W_Q^att), mamba2-130m.
    """
    return ModelConfig(layers=("oryx",) * 12, vocab_size=50304, d_model=768, num_heads=12,
                       ffn_dim=2048)


@register("oryx-gdn-340m")
def oryx_gdn_340m() -> ModelConfig:
    """21 Oryx-GDN layers, d_model 1024, 16 heads of 64, SwiGLU FFN 2816 (~348M params).

    Shared by both modes: 85.8 % of each block (`hybrid_jax.nn.oryx.shared_fraction`).
    Baselines: transformer-350m, gdn-340m, mamba2-340m.
    """
    return ModelConfig(layers=("oryx",) * 21, vocab_size=32000, d_model=1024, num_heads=16,
                       ffn_dim=2816)


def _oryx_mamba2(base: str) -> ModelConfig:
    """The Mamba-2 preset `base` with each layer an Oryx block in Mamba-2 mode (the same
    mixer, plus the attention query W_Q^att of G·N channels and RoPE)."""
    config = get(base)
    return config.replace(layers=tuple(
        layer("oryx", linear_mixer="mamba2", **dict(spec.options)) for spec in config.layers))


@register("oryx-mamba2-tiny")
def oryx_mamba2_tiny() -> ModelConfig:
    """mamba2-tiny as Oryx (4 layers, d_model 64, 8 value heads of 16, state 16, one B/C
    group: one attention head of 16 over all 8 value heads), no FFN.

    Shared by both modes (`hybrid_jax.nn.oryx.shared_fraction`): 90.9 % of each block, 92.0 %
    of the model; each mode owns its query (C, or W_Q^att: d·16 each), the linear mode dt / A /
    D. Baselines of the same size: mamba2-tiny, transformer-tiny, gdn-tiny.
    """
    return _oryx_mamba2("mamba2-tiny")


@register("oryx-mamba2-130m")
def oryx_mamba2_130m() -> ModelConfig:
    """mamba2-130m as Oryx: 24 layers, d_model 768, 24 value heads of 64, state 128, one
    group (one attention head of 128), no FFN (~131M params).

    Shared by both modes: 94.4 % of each block, 96.1 % of the model with the embeddings.
    Baselines: mamba2-130m, transformer-125m, gdn-130m.
    """
    return _oryx_mamba2("mamba2-130m")


@register("oryx-mamba2-340m")
def oryx_mamba2_340m() -> ModelConfig:
    """mamba2-340m as Oryx: 48 layers, d_model 1024, 32 value heads of 64, state 128, one
    group, no FFN (~356M params).

    Shared by both modes: 95.6 % of each block, 96.0 % of the model with the embeddings.
    Baselines: mamba2-340m, transformer-350m, gdn-340m.
    """
    return _oryx_mamba2("mamba2-340m")


@register("nha-hybrid-1b")
def nha_hybrid_1b() -> ModelConfig:
    """nha-hybrid-340m scaled to ~1.4B for FSDP: 24 layers, d_model 2048, 8 heads of 256, 64
    slots, window 32, FFN 5632, full windows in every 6th layer (1,389,512,704 params).

    Our choice of shape (a Llama-1B-like width and FFN with NHA's head size; transformer-1b is
    its baseline). In float32 its parameters, gradients and AdamW moments take 22 GB, so they
    are sharded: README, "Scaling" (`train.mesh.fsdp`, `model.scan_layers`, `model.remat`).
    """
    return ModelConfig(
        layers=tuple(layer("nha", window=None) if i % 6 == 5 else layer("nha")
                     for i in range(24)),
        vocab_size=32000, d_model=2048, num_heads=8, ffn_dim=5632, window=32,
        tie_embeddings=False)


@register("transformer-1b")
def transformer_1b() -> ModelConfig:
    """Llama-shaped ~1.1B (TinyLlama-1.1B's shape): 22 layers, d_model 2048, 32 heads of 64
    sharing 4 kv heads (GQA), SwiGLU 5632, RoPE, untied embeddings, vocab 32000
    (1,100,048,384 params): the transformer baseline of nha-hybrid-1b (same width, FFN and
    vocabulary). Train it sharded like nha-hybrid-1b (README, "Scaling")."""
    return ModelConfig(layers=("attention",) * 22, vocab_size=32000, d_model=2048, num_heads=32,
                       num_kv_heads=4, ffn_dim=5632, tie_embeddings=False)
