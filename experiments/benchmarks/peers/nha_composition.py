"""The PyTorch composition NHA is compared with: fla's `chunk_gsa` (the slots) beside a compiled
flex-attention sliding window (the window), timed fwd and fwd+bwd.

    python3 -m experiments.benchmarks.peers.nha_composition --shapes 4x8192,1x32768
        [--heads 16 --dim 128 --slots 64 --window 512 --iters 10]

Not the same math as NHA (two softmaxes whose outputs are summed, not one over slots and
window), but the same work a user would otherwise run: GSA over every token (M slots, log
gates logsigmoid(f)/8, s = 1 − e^g) and causal attention to the last `window` keys (the key
itself included), bf16, `[B, T, H, D]`. Needs torch with CUDA and flash-linear-attention
(`fla.ops.gsa`); neither is a dependency of hybrid_jax. Prints one JSON line per shape: ms of
the composition and of each part (medians of CUDA-event timings, `fla_linear.time_ms`), or an
`error`.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from experiments.benchmarks.peers.fla_linear import time_ms


def _inputs(batch, length, heads, dim, slots):
    make = lambda d, grad=True: torch.randn(batch, length, heads, d, device="cuda",
                                            dtype=torch.bfloat16, requires_grad=grad)
    q, k, v, qw, kw = (make(dim) for _ in range(5))
    f = torch.randn(batch, length, heads, slots, device="cuda", dtype=torch.float32)
    g = (F.logsigmoid(f) / 8).requires_grad_()
    return q, k, v, qw, kw, g


def _parts(window: int, length: int):
    """(gsa(q, k, v, g), window attention(qw, kw, v)) callables."""
    from fla.ops.gsa import chunk_gsa
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def in_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx < window)

    mask = create_block_mask(in_window, B=None, H=None, Q_LEN=length, KV_LEN=length,
                             device="cuda")
    flex = torch.compile(flex_attention)

    def gsa(q, k, v, g):
        s = (1 - torch.exp(g)).to(torch.bfloat16)
        out = chunk_gsa(q, k, v, s, g.to(torch.bfloat16), output_final_state=False)
        out = out[0] if isinstance(out, tuple) else out
        if out.shape != v.shape:  # an fla whose default layout is [B, H, T, ·]
            raise RuntimeError(f"chunk_gsa returned {tuple(out.shape)} for v {tuple(v.shape)}")
        return out

    def sliding(qw, kw, v):
        out = flex(qw.transpose(1, 2), kw.transpose(1, 2), v.transpose(1, 2), block_mask=mask)
        return out.transpose(1, 2)

    return gsa, sliding


def measure(batch, length, heads, dim, slots, window, iters) -> dict:
    q, k, v, qw, kw, g = _inputs(batch, length, heads, dim, slots)
    gsa, sliding = _parts(window, length)
    leaves = (q, k, v, qw, kw, g)
    calls = {
        "gsa": lambda: gsa(q, k, v, g),
        "window": lambda: sliding(qw, kw, v),
        "composition": lambda: gsa(q, k, v, g) + sliding(qw, kw, v),
    }
    row = {"B": batch, "T": length, "H": heads, "D": dim, "M": slots, "w": window}
    for name, call in calls.items():
        with torch.no_grad():
            row[f"{name}_fwd_ms"] = time_ms(call, iters=iters)

        def forward_backward(call=call):
            out = call()
            torch.autograd.grad(out.float().sum(), leaves, allow_unused=True)

        row[f"{name}_fwd_bwd_ms"] = time_ms(forward_backward, iters=iters)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="4x8192,1x32768", help="BxT,BxT,...")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    for shape in args.shapes.split(","):
        batch, length = (int(x) for x in shape.split("x"))
        try:
            row = measure(batch, length, args.heads, args.dim, args.slots, args.window,
                          args.iters)
        except Exception as e:  # noqa: BLE001  (one JSON line per shape, whatever happens)
            row = {"B": batch, "T": length, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
