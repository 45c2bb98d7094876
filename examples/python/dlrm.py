"""A DLRM-style recommendation model in plain torch, run on a vGPU with
vgpu.torch.

Dense features go through a bottom MLP; each sparse feature is a bag of
ids into its own table, pooled by nn.EmbeddingBag(mode="sum") from
indices and offsets (PyTorch's 1-D form: bag b is indices[offsets[b] :
offsets[b + 1]]); the bottom MLP's output and the pooled embeddings are
concatenated (torch.cat) and a top MLP gives one logit per sample.

The model returns the logit, not a probability: the kernel catalog has no
sigmoid, so torch.sigmoid would be refused when the model is captured.
Apply it on the host to the (small) output if a probability is wanted.

A batch is fixed in shape — a graph's shapes are — but not in content:
each table's bags may hold any number of its batch's ids, since the
offsets are an input like the ids. Each table's ids and offsets are
tensors of their own, as in the reference DLRM's lists (not rows of one
[tables, N] tensor): a row of an int32 tensor would have to be copied on
the device, and no kernel copies int32.

    python3 examples/python/dlrm.py --socket /run/vgpu/mediator.sock --tenant t1

runs a few batches on the vGPU and on CPU and prints the largest
difference between their logits.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence, Tuple

import torch
import torch.nn as nn


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers of sizes[0] -> sizes[1] -> ..., with ReLU between them
    (and after the last if last_relu)."""
    layers: list = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """forward(dense [B, dense], indices_0, offsets_0, indices_1, offsets_1, ...)
    -> logits [B, 1]; table t's bags are its ids indices_t ([N_t]) split at
    offsets_t ([B])."""

    def __init__(self, dense: int = 13, tables: Sequence[int] = (1000, 400, 100, 50), dim: int = 16,
                 bottom: Sequence[int] = (64,), top: Sequence[int] = (64, 32)):
        super().__init__()
        self.bottom = mlp([dense, *bottom, dim], last_relu=True)
        self.tables = nn.ModuleList([nn.EmbeddingBag(rows, dim, mode="sum") for rows in tables])
        self.top = mlp([dim * (1 + len(tables)), *top, 1], last_relu=False)

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        pooled = [bag(sparse[2 * t], sparse[2 * t + 1]) for t, bag in enumerate(self.tables)]
        z = torch.cat([x] + pooled, dim=1)
        return self.top(z)  # a logit: the catalog has no sigmoid


def make_model(seed: int = 0, **config: Any) -> DLRM:
    """A DLRM of config with torch's default initialisation drawn from seed
    (the global generator is left as it was), in eval mode."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = DLRM(**config)
    return model.eval()


def make_batch(model: DLRM, batch: int = 32, ids: int = 96, seed: int = 0) -> Tuple[torch.Tensor, ...]:
    """Random arguments of model's forward: batch samples of dense features
    and, per table, `ids` ids split into `batch` bags of random sizes (some
    empty)."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(batch, model.bottom[0].in_features, generator=g)]
    for bag in model.tables:
        out.append(torch.randint(0, bag.num_embeddings, (ids,), generator=g))
        cuts = torch.randint(0, ids + 1, (batch - 1,), generator=g).sort().values
        out.append(torch.cat([torch.zeros(1, dtype=torch.long), cuts]))
    return tuple(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("VGPU_SOCKET"), help="mediator socket (default $VGPU_SOCKET)")
    ap.add_argument("--tenant", default=os.environ.get("VGPU_TENANT"), help="tenant to act for (default $VGPU_TENANT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batches", type=int, default=4)
    a = ap.parse_args()

    import vgpu.torch

    model = make_model(a.seed)
    batches = [make_batch(model, seed=a.seed + 1 + i) for i in range(a.batches)]
    diff = 0.0
    with vgpu.torch.remote(model, batches[0], socket=a.socket, tenant=a.tenant) as gpu:
        for b in batches:
            got = gpu(*b)
            with torch.no_grad():
                want = model(*b)
            diff = max(diff, float((got - want).abs().max()))
    print("vgpu:", [round(float(v), 4) for v in got[:8, 0]])
    print("cpu: ", [round(float(v), 4) for v in want[:8, 0]])
    print(f"{a.batches} batches of {len(b[0])}; largest logit difference: {diff:.3g}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    main()
