"""A plain PyTorch GPT with the shapes of our `attention` stack, timed on full train steps.

    python3 -m experiments.benchmarks.peers.torch_gpt --layers 12 --d-model 768 --heads 12
        --ffn 2048 --vocab 32768 --batch 16 --length 2048 [--steps 10] [--warmup 3]

Same model as `ModelConfig(layers=("attention",) * L, ...)`: tied embeddings, pre-norm RMSNorm,
RoPE, multi-head causal attention (SDPA: flash), SwiGLU FFN, no biases; float32 parameters
under bf16 autocast, `torch.compile`, fused AdamW, gradient clipping. Attention is causal over
the whole window (no document boundaries: plain SDPA has none). Prints one JSON line: tokens/s,
compile and step times, peak memory.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class GPT(nn.Module):
    def __init__(self, layers, d, heads, ffn, vocab):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.head_dim = d // heads
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else None

    def forward(self, tokens):
        t = tokens.shape[1]
        inv = 10000.0 ** (-torch.arange(0, self.head_dim // 2, device=tokens.device) * 2
                          / self.head_dim)
        angles = torch.arange(t, device=tokens.device)[:, None] * inv
        cos, sin = angles.cos()[:, None], angles.sin()[:, None]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x) @ self.embed.weight.T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 12), ("d-model", 768), ("heads", 12), ("ffn", 2048),
                          ("vocab", 32768), ("batch", 16), ("length", 2048), ("steps", 10),
                          ("warmup", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda"
    model = GPT(args.layers, args.d_model, args.heads, args.ffn, args.vocab).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                  weight_decay=0.1, fused=True)
    compiled = torch.compile(model)

    def step(tokens, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = compiled(tokens)
        loss = F.cross_entropy(logits.float().view(-1, args.vocab), targets.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    tokens = torch.randint(0, args.vocab, (args.batch, args.length + 1), device=device)
    inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    start = time.perf_counter()
    step(inputs, targets).item()
    compile_s = time.perf_counter() - start
    for _ in range(args.warmup):
        step(inputs, targets)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step(inputs, targets)
    loss.item()
    seconds = (time.perf_counter() - start) / args.steps
    print(json.dumps({
        "impl": "torch", "params": sum(p.numel() for p in model.parameters()),
        "compile_s": compile_s, "step_ms": seconds * 1e3,
        "tokens_per_s": args.batch * args.length / seconds,
        "peak_GiB": torch.cuda.max_memory_allocated() / 2**30, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
