"""What the backward pass keeps: RMSNorm, SwiGLU, cosine attention's L2 norm and GSS recompute
their elementwise terms from their inputs / dot outputs (`jax.checkpoint`), and their reverse-mode
gradients still equal forward-mode derivatives (which `jax.checkpoint` does not change)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from hybrid_jax import presets
from hybrid_jax.config import ModelConfig, layer
from hybrid_jax.context import TokenContext
from hybrid_jax.nn.layers import RMSNorm, SwiGLU
from hybrid_jax.nn.lm import create_model
from hybrid_jax.ops.attention import l2_normalize
from tests.nn.test_mamba2 import first_mixer

D, HIDDEN, GATE = 8, 24, 16  # d_model, SwiGLU hidden width, GSS gate width (expansion 2)


def modules(dtype):
    """name → (module, x) of every module whose backward is checked here."""
    rngs = nnx.Rngs(0)
    x = jax.random.normal(jax.random.key(1), (2, 5, D), dtype)
    gss = first_mixer(ModelConfig(layers=(layer("gss", expansion=2, ssm_dim=4, state_size=6),),
                                  vocab_size=32, d_model=D, num_heads=2, init_std=0.5,
                                  dtype=jnp.dtype(dtype).name))
    return {"rms_norm": (RMSNorm(D, dtype=dtype, param_dtype=dtype), x),
            "swiglu": (SwiGLU(D, HIDDEN, rngs=rngs, dtype=dtype, param_dtype=dtype), x),
            "gss": (gss, x)}


def as_function(module):
    graphdef, params, rest = nnx.split(module, nnx.Param, ...)
    # No documents: their masked Toeplitz product is a custom_vjp, which has no forward mode.
    ctx = TokenContext.create((2, 5))

    def run(x, params):
        module = nnx.merge(graphdef, params, rest)
        return module(x, ctx) if hasattr(module, "discretize") else module(x)
    return run, params


def check_reverse_matches_forward(fn, *args):
    """`⟨∇ Σ w·fn(args), t⟩` (reverse mode, through the rematerialised backward) equals the
    forward-mode derivative of `Σ w·fn(args)` along random tangents t."""
    leaves, tree = jax.tree.flatten(args)
    keys = jax.random.split(jax.random.key(7), len(leaves) + 1)
    tangents = tree.unflatten([jax.random.normal(k, x.shape, x.dtype)
                               for k, x in zip(keys[1:], leaves, strict=True)])
    weights = jax.random.normal(keys[0], jax.eval_shape(fn, *args).shape)
    loss = lambda *a: jnp.sum(weights * fn(*a).astype(jnp.float32))  # noqa: E731
    _, forward = jax.jvp(loss, args, tangents)
    grads = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
    pairs = list(zip(jax.tree.leaves(grads), jax.tree.leaves(tangents), strict=True))
    reverse = sum(jnp.vdot(g, t) for g, t in pairs)
    # The error scale of a float32 sum whose terms cancel is Σ|terms|, not the sum: the two
    # modes add in different orders (the GSS branch on one host: 1.0e-5 of the sum, 3.5e-8 of
    # its terms' scale). Its smallest parameter's term is 3.9e-5 of the scale, so an error of
    # 2.5 % in any one gradient still fails.
    scale = sum(jnp.sum(jnp.abs(g * t)) for g, t in pairs)
    assert abs(float(reverse) - float(forward)) <= 1e-6 * float(scale), (reverse, forward, scale)


@pytest.mark.parametrize("name", ["rms_norm", "swiglu", "gss", "l2_normalize"])
def test_reverse_mode_matches_forward_mode(name):
    if name == "l2_normalize":
        check_reverse_matches_forward(l2_normalize, modules(jnp.float32)["rms_norm"][1])
        return
    module, x = modules(jnp.float32)[name]
    run, params = as_function(module)
    check_reverse_matches_forward(run, x, params)


def saved_shapes(fn, *args, capsys) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of every residual the backward of `sum(fn(*args))` keeps."""
    capsys.readouterr()
    print_saved_residuals(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), *args)
    found = re.findall(r"\b(bf16|f16|f32|f64|c64|i32|bool)\[([\d,]*)\]",
                       capsys.readouterr().out)
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in found]


@pytest.mark.parametrize("name,width,kept", [("rms_norm", D, 1), ("swiglu", HIDDEN, 2),
                                             ("gss", GATE, 2)])
def test_backward_keeps_inputs_and_dot_outputs_only(name, width, kept, capsys):
    """bf16 activations: no float32 copy of an activation, and of the widest activations only
    the `kept` ones the backward needs (RMSNorm: x; SwiGLU: both dot outputs; GSS: the gate's
    and W_uc's dot outputs)."""
    module, x = modules(jnp.bfloat16)[name]
    run, params = as_function(module)
    saved = saved_shapes(run, x, params, capsys=capsys)
    wide = [(dtype, shape) for dtype, shape in saved if shape[:2] == (2, 5) and
            shape[-1] == width]
    assert len(wide) == kept and all(dtype == "bf16" for dtype, _ in wide), saved
    saved = saved_shapes(l2_normalize, x, capsys=capsys)
    assert saved == [("bf16", x.shape)], saved
    np.testing.assert_array_equal(np.asarray(l2_normalize(x)).dtype, jnp.bfloat16)


def test_parallel_block_keeps_only_its_branch_outputs_beyond_the_branches(capsys):
    """A bf16 PHA block (GSS ‖ attention ‖ Dual-FFN, branch norms, learned mixing, DeepNorm)
    keeps its branches' residuals (sharing the input x) plus each branch's output, all bf16: its
    norms, mixing and residual are recomputed (`combine_branches`), not kept as each norm's
    output and the pre-norm sum (seven `[B, T, D]` activations instead of three)."""
    config = presets.get("pha-tiny").replace(dtype="bfloat16")
    block = create_model(config.replace(layers=config.layers[:1])).blocks[0]
    x = jax.random.normal(jax.random.key(1), (2, 5, config.d_model), jnp.bfloat16)
    ctx = TokenContext.create((2, 5))

    def model_wide(module):
        graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        run = lambda x, params: nnx.merge(graphdef, params, rest)(x, ctx)  # noqa: E731
        return [s for s in saved_shapes(run, x, params, capsys=capsys) if s[1] == x.shape]

    branches = [model_wide(getattr(block, name)) for name in block.names]
    saved = model_wide(block)
    n = len(block.names)
    assert len(saved) == sum(map(len, branches)) - (n - 1) + n, (saved, branches)
    assert all(dtype == "bf16" for dtype, _ in saved), saved


@pytest.mark.parametrize("norm_before_gate", [True, False])
def test_gated_rms_norm_keeps_only_its_bf16_inputs(norm_before_gate, capsys):
    """GatedRMSNorm (Gated DeltaNet's output norm, Mamba-2's grouped norm) recomputes its
    float32 terms in the backward: it keeps x and the gate z, bf16, nothing of float32; and
    its gradients still equal forward-mode derivatives."""
    from hybrid_jax.nn.layers import GatedRMSNorm

    norm = GatedRMSNorm(2 * D, group_size=D, norm_before_gate=norm_before_gate,
                        dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    x, z = (jax.random.normal(jax.random.key(i), (2, 5, 2 * D), jnp.bfloat16) for i in (1, 2))
    saved = saved_shapes(lambda x, z: norm(x, z), x, z, capsys=capsys)
    assert [entry for entry in saved if entry[1][:2] == (2, 5)] == [("bf16", (2, 5, 2 * D))] * 2
    assert all(dtype == "bf16" for dtype, _ in saved), saved  # (and γ)
    norm32 = GatedRMSNorm(2 * D, group_size=D, norm_before_gate=norm_before_gate)
    check_reverse_matches_forward(lambda x, z: norm32(x, z), x.astype(jnp.float32),
                                  z.astype(jnp.float32))


@pytest.mark.parametrize("packed", [False, True])
def test_short_conv_keeps_only_its_bf16_input(packed, capsys):
    """The convolution's XLA rung recomputes its shifted, masked float32 terms and SiLU in the
    backward: it keeps x (bf16), not ≈ 3K float32 copies of it; its gradients still equal
    forward-mode derivatives."""
    from hybrid_jax.nn.layers import ShortConv

    conv = ShortConv(D, 4, rngs=nnx.Rngs(0), use_bias=True, dtype=jnp.bfloat16,
                     param_dtype=jnp.bfloat16)
    x = jax.random.normal(jax.random.key(1), (2, 5, D), jnp.bfloat16)
    ids = jnp.asarray([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]) if packed else None
    saved = saved_shapes(lambda x: conv(x, ids), x, capsys=capsys)
    activations = [entry for entry in saved if entry[1][:2] == (2, 5) and entry[0] != "i32"]
    assert activations == [("bf16", (2, 5, D))], saved  # (besides the segment ids and w, b)
    conv32 = ShortConv(D, 4, rngs=nnx.Rngs(0), use_bias=True)
    check_reverse_matches_forward(lambda x: conv32(x, ids), x.astype(jnp.float32))



def test_mamba2_recurrence_hands_the_gated_norm_its_compute_dtype():
    """Mamba-2's SSD + D skip is summed in float32 and rounded once to the compute dtype (as
    mamba_ssm's kernels return it), so the gated norm, which keeps its inputs for the backward
    (test above), keeps a bf16 y, not a float32 one (mamba2-130m: 25.4 → 22.3 KB a token);
    float32 models keep float32."""
    for dtype in ("bfloat16", "float32"):
        config = ModelConfig(layers=(layer("mamba2", ssm_head_dim=4, state_size=4),),
                             vocab_size=32, d_model=D, num_heads=2, dtype=dtype)
        mixer = first_mixer(config)
        x = jax.random.normal(jax.random.key(2), (2, 5, D), dtype)
        y, _ = mixer.recurrence(*mixer.features(x)[:4])
        assert y.dtype == jnp.dtype(dtype) and y.shape == (2, 5, mixer.heads, mixer.head_dim)
