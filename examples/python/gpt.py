"""A GPT-style decoder in plain torch, run on a vGPU with vgpu.torch.

The model is what a tutorial would write: token and position embeddings,
pre-norm blocks of causal self-attention (matmul, a mask from a tril
buffer filled with -inf, softmax) and a GELU MLP, a final LayerNorm and a
linear head. Its KV cache is two module buffers per block, of fixed
capacity, written with slice assignment at `pos`; every step attends over
the whole cache, the mask hiding what is not written yet, so that the
shapes of a step do not depend on the position.

`vgpu.torch.remote` captures forward twice — at the prompt (prefill) and
at one token (decode) — and returns a RemoteModule that `generate` calls
exactly as it calls the CPU module: one round trip per step.

    python3 examples/python/gpt.py --socket /run/vgpu/mediator.sock --tenant t1

runs greedy generation on the vGPU and on CPU and prints both token lists
and the largest difference between their logits.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """Pre-norm transformer block with a KV cache of `capacity` positions."""

    def __init__(self, d: int, heads: int, capacity: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        hd = d // heads
        self.register_buffer("k_cache", torch.zeros(1, heads, capacity, hd))
        self.register_buffer("v_cache", torch.zeros(1, heads, capacity, hd))
        self.register_buffer("mask", torch.tril(torch.ones(capacity, capacity)).view(1, 1, capacity, capacity))

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, self.heads, hd).transpose(1, 2)
        k = k.view(b, t, self.heads, hd).transpose(1, 2)
        v = v.view(b, t, self.heads, hd).transpose(1, 2)
        self.k_cache[:, :, pos:pos + t] = k
        self.v_cache[:, :, pos:pos + t] = v
        att = (q @ self.k_cache.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(self.mask[:, :, pos:pos + t, :] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ self.v_cache).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return x


class GPT(nn.Module):
    """forward(idx [1, t] token ids, pos: int) -> logits [1, t, vocab] of
    positions pos .. pos + t - 1, appending their keys and values to the cache."""

    def __init__(self, vocab: int = 256, d: int = 64, heads: int = 4, layers: int = 2, capacity: int = 64):
        super().__init__()
        self.capacity = capacity
        self.tok = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(capacity, d)
        self.blocks = nn.ModuleList([Block(d, heads, capacity) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, pos: int) -> torch.Tensor:
        b, t = idx.shape
        x = self.tok(idx) + self.pos_emb(torch.arange(pos, pos + t))
        for block in self.blocks:
            x = block(x, pos)
        return self.head(self.ln_f(x))


def make_model(seed: int = 0, **config: Any) -> GPT:
    """A GPT of config with torch's default initialisation drawn from seed
    (the global generator is left as it was), LayerNorms' scales and shifts
    moved off 1 and 0 so that they matter; in eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = GPT(**config)
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.LayerNorm):
                    m.weight.add_(0.1 * torch.randn(m.weight.shape))
                    m.bias.add_(0.1 * torch.randn(m.bias.shape))
    return model.eval()


def generate(model: Any, prompt: torch.Tensor, n: int) -> Tuple[List[int], List[torch.Tensor]]:
    """Greedy decoding of n tokens after prompt ([1, t] ids): one prefill
    call, then one decode call per further token. model is the CPU module
    or its RemoteModule; both are called alike. Returns the tokens and, for
    each, the logits it was chosen from."""
    if n <= 0:
        return [], []
    t = prompt.shape[1]
    if t + n - 1 > getattr(model, "capacity", t + n - 1):
        raise ValueError(f"a prompt of {t} and {n} tokens overflow the KV cache of {model.capacity}")
    with torch.no_grad():
        logits = model(prompt, 0)[0, -1]
        tokens, steps = [int(logits.argmax())], [logits]
        for pos in range(t, t + n - 1):
            logits = model(torch.tensor([[tokens[-1]]]), pos)[0, -1]
            tokens.append(int(logits.argmax()))
            steps.append(logits)
    return tokens, steps


def remote_gpt(model: GPT, prompt_len: int, **kwargs: Any) -> Any:
    """model on a vGPU: a prefill graph for prompts of prompt_len tokens and
    a decode graph for one token, sharing the weights and the KV cache."""
    import vgpu.torch

    return vgpu.torch.remote(model, (torch.zeros(1, prompt_len, dtype=torch.long), 0),
                             decode_inputs=(torch.zeros(1, 1, dtype=torch.long), prompt_len), **kwargs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("VGPU_SOCKET"), help="mediator socket (default $VGPU_SOCKET)")
    ap.add_argument("--tenant", default=os.environ.get("VGPU_TENANT"), help="tenant to act for (default $VGPU_TENANT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=8, help="prompt length")
    ap.add_argument("-n", type=int, default=32, help="tokens to generate")
    a = ap.parse_args()

    model = make_model(a.seed)
    prompt = torch.randint(0, model.tok.num_embeddings, (1, a.prompt), generator=torch.Generator().manual_seed(a.seed + 1))
    with remote_gpt(model, a.prompt, socket=a.socket, tenant=a.tenant) as gpu:
        got, got_logits = generate(gpu, prompt, a.n)
    want, want_logits = generate(model, prompt, a.n)
    diff = max(float((g - w).abs().max()) for g, w in zip(got_logits, want_logits))
    print("vgpu:", got)
    print("cpu: ", want)
    print(f"same tokens: {got == want}; largest logit difference: {diff:.3g}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    main()
