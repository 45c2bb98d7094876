"""Each torch operation docs/torch.md says runs, in a small module run
through vgpu.torch.remote against a real mediator, compared with CPU torch.

The example models (test_torch.py) use each operation one way; these use
them the other ways the table claims: a broadcast operand on the left,
negative indices and starts, a split into unequal parts, a concatenation
of three, the activations' variants, expanded operands. One mediator and
one session serve the whole module (each case loads and closes its own
graph), which keeps the file within a few seconds.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Tuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vgpu
import vgpu.torch
from conftest import Mediator
from vgpu.torch.eager import eager

TOL = 1e-5


@pytest.fixture(scope="module")
def client() -> Iterator[vgpu.Client]:
    with tempfile.TemporaryDirectory(prefix="vgpu-") as tmp:
        m = Mediator(Path(tmp))
        try:
            with vgpu.Client(socket=m.socket, tenant="ops") as c:
                yield c
        finally:
            m.stop()


class Fn(nn.Module):
    """forward is f(self, *args); parameters are made by init(self)."""

    def __init__(self, f: Callable[..., Any], init: Callable[[nn.Module], None] = lambda m: None) -> None:
        super().__init__()
        self.f = f
        init(self)

    def forward(self, *args: Any) -> Any:
        return self.f(self, *args)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def linear(d_in: int, d_out: int, bias: bool = True) -> Callable[[nn.Module], None]:
    def init(m: nn.Module) -> None:
        torch.manual_seed(0)
        m.l = nn.Linear(d_in, d_out, bias=bias)
    return init


def params(init: Callable[[nn.Module], None], **shapes: Tuple[int, ...]) -> Callable[[nn.Module], None]:
    """init, then a parameter of each of shapes (seeded)."""
    def both(m: nn.Module) -> None:
        init(m)
        for i, (name, shape) in enumerate(shapes.items()):
            setattr(m, name, nn.Parameter(randn(*shape, seed=100 + i)))
    return both


def none(m: nn.Module) -> None:
    pass


X = randn(2, 3, 8)
Y = randn(2, 3, 8, seed=1)
S = randn(2, 4, 6, 6, seed=2)  # scores: batch, heads, q, k

CASES = {
    # arithmetic
    "add": (Fn(lambda m, x, y: x + y), (X, Y)),
    "add_bias_left": (Fn(lambda m, x: m.b + x, params(none, b=(8,))), (X,)),
    "add_bias_right": (Fn(lambda m, x: x + m.b, params(none, b=(8,))), (X,)),
    "add_row_block": (Fn(lambda m, x: m.b + x, params(none, b=(3, 8))), (X,)),
    "add_alpha": (Fn(lambda m, x, y: torch.add(x, y, alpha=0.5)), (X, Y)),
    "sub": (Fn(lambda m, x, y: x - y), (X, Y)),
    "sub_bias_left": (Fn(lambda m, x: m.b - x, params(none, b=(8,))), (X,)),
    "sub_bias_right": (Fn(lambda m, x: x - m.b, params(none, b=(8,))), (X,)),
    "add_number": (Fn(lambda m, x: x + 1.5), (X,)),
    "number_add": (Fn(lambda m, x: 1.5 + x), (X,)),
    "sub_number": (Fn(lambda m, x: x - 2), (X,)),
    "number_sub": (Fn(lambda m, x: 1 - x), (X,)),
    "neg": (Fn(lambda m, x: -x), (X,)),
    "neg_add": (Fn(lambda m, x, y: -x + y), (X, Y)),
    "mul": (Fn(lambda m, x, y: x * y), (X, Y)),
    "mul_bias_left": (Fn(lambda m, x: m.b * x, params(none, b=(8,))), (X,)),
    "mul_number": (Fn(lambda m, x: x * 3), (X,)),
    "number_mul": (Fn(lambda m, x: 0.25 * x), (X,)),
    "div_number": (Fn(lambda m, x: x / 4), (X,)),
    "div_buffer": (Fn(lambda m, x: x / m.c, lambda m: m.register_buffer("c", torch.arange(1., 9.))), (X,)),
    "sub_alpha_buffer": (Fn(lambda m, x: torch.sub(x, m.c, alpha=2), lambda m: m.register_buffer("c", torch.arange(1., 9.))), (X,)),
    "scaled_add": (Fn(lambda m, x, y: x * 2 + y / 3), (X, Y)),
    "expand_add": (Fn(lambda m, x: x + m.b.expand(2, 3, 8), params(none, b=(8,))), (X,)),
    "expand_left_mul": (Fn(lambda m, x: m.b.expand_as(x) * x, params(none, b=(1, 1, 8))), (X,)),
    "expand_rows_add": (Fn(lambda m, x: x + m.b.unsqueeze(0).expand(2, 3, 8), params(none, b=(3, 8))), (X,)),
    # products
    "linear": (Fn(lambda m, x: m.l(x), linear(8, 5)), (X,)),
    "linear_2d": (Fn(lambda m, x: m.l(x[0]), linear(8, 5)), (X,)),
    "linear_no_bias": (Fn(lambda m, x: m.l(x), linear(8, 5, bias=False)), (X,)),
    "matmul_weight": (Fn(lambda m, x: x @ m.w, params(none, w=(8, 4))), (X,)),
    "matmul_transposed": (Fn(lambda m, x, y: x @ y.transpose(-1, -2)), (X, Y)),
    "matmul_4d": (Fn(lambda m, s: s @ s.transpose(-1, -2)), (S,)),
    "bmm": (Fn(lambda m, x, y: torch.bmm(x.transpose(1, 2), y)), (X, Y)),
    "matmul_weight_left": (Fn(lambda m, x: m.w @ x, params(none, w=(5, 3))), (X,)),
    "matmul_4d_weight": (Fn(lambda m, s: s @ m.w, params(none, w=(6, 2))), (S,)),
    "matmul_vector_right": (Fn(lambda m, x: x[0] @ m.w, params(none, w=(8,))), (X,)),
    "matmul_vector_left": (Fn(lambda m, x: x[0, 0] @ m.w, params(none, w=(8, 5))), (X,)),
    "matmul_vectors": (Fn(lambda m, x: m.w @ x[0, 0], params(none, w=(8,))), (X,)),
    "linear_of_views": (Fn(lambda m, x: (m.l(x.transpose(0, 1)), m.l(x[:, 1:])), linear(8, 5)), (X,)),
    "addmm_bias_block": (Fn(lambda m, x: torch.addmm(m.b, x[0], m.w), params(none, b=(3, 4), w=(8, 4))), (X,)),
    # rows
    "layer_norm": (Fn(lambda m, x: m.ln(x), lambda m: setattr(m, "ln", nn.LayerNorm(8))), (X,)),
    "layer_norm_no_affine": (Fn(lambda m, x, y: (m.a(x), m.b(y)),
                                lambda m: (setattr(m, "a", nn.LayerNorm(8, elementwise_affine=False)),
                                           setattr(m, "b", nn.LayerNorm(8, elementwise_affine=False)))), (X, Y * 3 + 1)),
    "layer_norm_f": (Fn(lambda m, x: F.layer_norm(x, (8,), eps=1e-3)), (X,)),
    "layer_norm_2d": (Fn(lambda m, x: F.layer_norm(x, (3, 8))), (X,)),
    "gelu": (Fn(lambda m, x: F.gelu(x)), (X,)),
    "gelu_tanh": (Fn(lambda m, x: F.gelu(x, approximate="tanh")), (X,)),
    "silu": (Fn(lambda m, x: F.silu(x)), (X,)),
    "relu": (Fn(lambda m, x: F.relu(x)), (X,)),
    "relu_of_view": (Fn(lambda m, x: torch.relu(x.transpose(0, 1))), (X,)),
    "softmax": (Fn(lambda m, s: torch.softmax(s, -1)), (S,)),
    "softmax_scaled": (Fn(lambda m, s: torch.softmax(s / 8 * 2, dim=-1)), (S,)),
    "softmax_causal": (Fn(lambda m, s: torch.softmax(
        (s * 0.5).masked_fill(torch.tril(torch.ones(6, 6)) == 0, float("-inf")), -1)), (S,)),
    "softmax_causal_buffer": (Fn(lambda m, s: torch.softmax(
        s.masked_fill(m.mask[:, :, :6, :6] == 0, float("-inf")), -1),
        lambda m: m.register_buffer("mask", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))), (S,)),
    "softmax_causal_triu": (Fn(lambda m, s: torch.softmax(
        s.masked_fill(torch.triu(torch.ones(6, 6), 1).bool(), float("-inf")), -1)), (S,)),
    "softmax_causal_then_scaled": (Fn(lambda m, s: torch.softmax(
        (s * 0.5).masked_fill(torch.tril(torch.ones(6, 6)) == 0, -1e9) / 4, -1)), (S,)),
    "argmax_of_scaled": (Fn(lambda m, x: (x * -1).argmax(-1)), (X,)),
    "relu_of_scaled": (Fn(lambda m, x: torch.relu(x * -2)), (X,)),
    "argmax": (Fn(lambda m, x: torch.argmax(x, dim=-1)), (X,)),
    "argmax_keepdim": (Fn(lambda m, x: x.argmax(-1, keepdim=True)), (X,)),
    "embedding_constant_ids": (Fn(lambda m, x: (m.e(torch.tensor([1, 3])), m.e(torch.arange(0, 3)) + x[0, :, :4]),
                                  lambda m: setattr(m, "e", nn.Embedding(10, 4))), (X,)),
    "matmul_of_constants": (Fn(lambda m, x: x[0, 0] + torch.ones(8) @ torch.ones(8, 8)), (X,)),
    "embedding": (Fn(lambda m, i: m.e(i), lambda m: setattr(m, "e", nn.Embedding(10, 4))),
                  (torch.tensor([[1, 2, 9], [0, 0, 5]]),)),
    # views
    "view_reshape": (Fn(lambda m, x: x.view(6, 8).reshape(2, 24) + 0.5), (X,)),
    "unsqueeze_squeeze": (Fn(lambda m, x: x.unsqueeze(1).squeeze(1).flatten(0, 1) * 2), (X,)),
    "transpose": (Fn(lambda m, x: x.transpose(0, 2).contiguous()), (X,)),
    "permute": (Fn(lambda m, s: s.permute(0, 2, 1, 3).contiguous()), (S,)),
    "t": (Fn(lambda m, x: x[0].t() * 1.0), (X,)),
    "clone_detach": (Fn(lambda m, x: x.clone().detach() + 0.0), (X,)),
    "slice": (Fn(lambda m, x: x[..., 2:5] * 1.0), (X,)),
    "slice_negative_start": (Fn(lambda m, x: x[..., -3:] * 1.0), (X,)),
    "slice_negative_end": (Fn(lambda m, x: x[:, -2:-1] * 1.0), (X,)),
    "slice_past_the_start": (Fn(lambda m, x: x[..., -100:2] * 1.0), (X,)),
    "slice_rows": (Fn(lambda m, x: x[1:] * 1.0), (X,)),
    "select": (Fn(lambda m, x: x[:, 1] * 1.0), (X,)),
    "select_negative": (Fn(lambda m, x: x[:, -1] * 1.0), (X,)),
    "select_last_dim": (Fn(lambda m, x: x[..., -2] * 1.0), (X,)),
    "slice_block": (Fn(lambda m, x: x[0, 1:3, 2:5] * 1.0), (X,)),
    "slice_block_3d": (Fn(lambda m, x: x[:, 1:, 2:5] * 1.0), (X,)),
    "slice_leading_rows": (Fn(lambda m, x: x.view(6, 8)[:4] * 1.0), (X,)),
    "slice_column_of_rows": (Fn(lambda m, x: x.view(6, 8)[:4, 3] * 1.0), (X,)),
    "slice_column_from_row": (Fn(lambda m, x: x.view(6, 8)[2:5, -1] * 1.0), (X,)),
    "slice_transposed": (Fn(lambda m, x: x[..., 2:6].transpose(1, 2).contiguous()), (X,)),
    "narrow": (Fn(lambda m, x: x.narrow(2, 1, 4) * 1.0), (X,)),
    "split": (Fn(lambda m, x: [p * 1.0 for p in x.split(3, dim=-1)]), (X,)),
    "split_with_sizes": (Fn(lambda m, x: [p * 1.0 for p in x.split([2, 5, 1], dim=-1)]), (X,)),
    "chunk": (Fn(lambda m, x: [p * 1.0 for p in x.chunk(2, dim=-1)]), (X,)),
    "unbind": (Fn(lambda m, x: [p * 1.0 for p in x.unbind(1)]), (X,)),
    "unbind_last": (Fn(lambda m, x: [p * 1.0 for p in x.unbind(-1)][:3]), (X,)),
    "qkv": (Fn(lambda m, x: [p.view(2, 3, 2, 4).transpose(1, 2) @ p.view(2, 3, 2, 4).transpose(1, 2).transpose(-1, -2)
                             for p in m.l(x).split(8, dim=-1)], linear(8, 24)), (X,)),
    # concatenation
    "cat": (Fn(lambda m, x, y: torch.cat([x, y], dim=-1)), (X, Y)),
    "cat3": (Fn(lambda m, x, y: torch.cat([x, y * 2, x + 1], dim=1)), (X, Y)),
    "cat_negative_dim": (Fn(lambda m, x, y: torch.cat((x, y), -2)), (X, Y)),
    "cat_dim0": (Fn(lambda m, x, y: torch.cat([y, x, y], dim=0)), (X, Y)),
    "cat_views": (Fn(lambda m, x, y: torch.cat([x[..., :3], y.transpose(0, 1).transpose(0, 1)], -1)), (X, Y)),
    # outputs that are inputs or views of them
    "identity": (Fn(lambda m, x: x), (X,)),
    "view_of_input": (Fn(lambda m, x: x[0]), (X,)),
    "scaled": (Fn(lambda m, x: x * -2), (X,)),
    "constant": (Fn(lambda m, x: (x * 2, torch.ones(3))), (X,)),
    "buffer_returned": (Fn(lambda m, x: (x * 2, m.c), lambda m: m.register_buffer("c", torch.arange(3.0))), (X,)),
    "two_outputs_one_value": (Fn(lambda m, x: (x * 2, (x * 2).view(6, 8))), (X,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_cpu(client: vgpu.Client, name: str) -> None:
    module, args = CASES[name]
    with torch.no_grad():
        want = module(*args)
    with vgpu.torch.remote(module, args, client=client) as r:
        same(name, r(*args), want)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_by_op_matches_cpu(client: vgpu.Client, name: str) -> None:
    """The same lowering, one operation at a time (vgpu.torch.eager)."""
    module, args = CASES[name]
    with torch.no_grad():
        want = module(*args)
    e = eager(module, args, client)
    try:
        same(name, e(*args), want)
    finally:
        e.close()


class ReadAtPos(nn.Module):
    """Writes x's rows into a cache at pos and reads back from pos, by a
    slice whose start moves with pos."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 6, 8))

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        self.cache[:, pos:pos + 2] = x * 2
        return self.cache[:, pos + 1:pos + 2] + 1


def test_slice_at_a_scalar_position(client: vgpu.Client) -> None:
    model = ReadAtPos()
    with vgpu.torch.remote(model, (X[:, :2], 0), client=client) as r:
        for pos in (0, 3, 1, 4):
            x = randn(2, 2, 8, seed=pos)
            with torch.no_grad():
                want = model(x, pos)
            same(f"pos {pos}", r(x, pos), want)


class Rows(nn.Module):
    """A cache of rows that forward reads, by a copy or scaled, before it
    writes x into it at pos (through a slice or a select): what is read is
    what the cache held before the write."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.register_buffer("cache", torch.arange(48.0).view(2, 3, 8))

    def forward(self, x: torch.Tensor, pos: int) -> Tuple[torch.Tensor, torch.Tensor]:
        before = self.cache.clone() if self.how == "clone" else self.cache * 2
        if self.how == "select":
            self.cache[:, pos] = x
        else:
            self.cache[:, pos:pos + 1] = x.unsqueeze(1)
        return before, self.cache * 1


@pytest.mark.parametrize("how", ["clone", "scaled", "select"])
def test_kv_cache_reads_before_a_write(client: vgpu.Client, how: str) -> None:
    model = Rows(how)
    # The example's run writes its x into (a clone of) the cache; the cache
    # on the device starts as the module holds it all the same.
    with vgpu.torch.remote(model, (randn(2, 8, seed=9), 0), client=client) as r:
        for pos in (0, 2, 1, 2):
            x = randn(2, 8, seed=pos)
            with torch.no_grad():
                want = model(x, pos)
            same(f"{how} at {pos}", r(x, pos), want)


class Previous(nn.Module):
    """A state buffer written whole, in place, at each call (an RNN's
    hidden state): each call adds the previous call's x."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.ones(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.state
        self.state.copy_(x)
        return y


def test_buffer_written_whole_in_place(client: vgpu.Client) -> None:
    model = Previous()
    with vgpu.torch.remote(model, (X[0, :2],), client=client) as r:
        for seed in range(3):
            x = randn(2, 8, seed=seed)
            with torch.no_grad():
                want = model(x)
            same(f"call {seed}", r(x), want)


class ReadBlockAtPos(ReadAtPos):
    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        self.cache[:, pos:pos + 2] = x
        return self.cache[:, pos:pos + 2, :4] + 1


def test_slice_at_a_scalar_position_of_two_dimensions_is_refused(client: vgpu.Client) -> None:
    n = client.requests
    with pytest.raises(vgpu.torch.TraceError) as e:
        vgpu.torch.remote(ReadBlockAtPos(), (X[:, :2], 0), client=client)
    msg = str(e.value)
    assert "[2, 2, 4]" in msg and "one dimension only" in msg and "self.cache[:, pos:pos + 2, :4]" in msg, msg
    assert client.requests == n


def test_masked_scores_scaled_by_a_negative_number_are_refused(client: vgpu.Client) -> None:
    # softmax(masked * -1) sees the hidden columns at +inf; the kernel, which
    # scales and then masks, would hide them: a different result.
    module = Fn(lambda m, s: torch.softmax(s.masked_fill(torch.tril(torch.ones(6, 6)) == 0, -1e9) * -1, -1))
    with pytest.raises(vgpu.torch.TraceError) as e:
        vgpu.torch.remote(module, (S,), client=client)
    assert "multiplied by -1" in str(e.value), str(e.value)


REFUSED = {
    # A host tensor changed in place is, for every earlier use, its last value.
    "in-place operation aten.tril_.default on a value computed on the host": (
        Fn(lambda m, s: torch.softmax(s.masked_fill(torch.ones(6, 6).tril_() == 0, float("-inf")), -1)), (S,)),
    # Registration would refuse it, after the weights were sent.
    "a concatenation of int32 ids": (
        Fn(lambda m, i, j: m.e(torch.cat([i, j])), lambda m: setattr(m, "e", nn.Embedding(5, 2))),
        (torch.tensor([1, 2]), torch.tensor([3]))),
}


@pytest.mark.parametrize("message", sorted(REFUSED))
def test_refused_before_anything_is_sent(client: vgpu.Client, message: str) -> None:
    module, args = REFUSED[message]
    n = client.requests
    with pytest.raises(vgpu.torch.TraceError) as e:
        vgpu.torch.remote(module, args, client=client)
    assert message in str(e.value) and "test_torch_ops.py:" in str(e.value), str(e.value)
    assert client.requests == n


def same(name: str, got: Any, want: Any) -> None:
    gl, wl = _flat(got), _flat(want)
    assert len(gl) == len(wl)
    for g, w in zip(gl, wl):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        diff = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
        assert diff <= TOL, f"{name}: differs from CPU torch by {diff}"


def _flat(v: Any) -> list:
    if isinstance(v, (list, tuple)):
        return [y for x in v for y in _flat(x)]
    return [v]


def test_op_by_op_call_that_fails_returns_its_memory(client: vgpu.Client) -> None:
    module = Fn(lambda m, x, bad: torch.cumsum(x * 2 + 1, -1) if bad else x * 2 + 1)
    e = eager(module, (X, False), client)
    try:
        pooled = []
        for _ in range(3):
            with pytest.raises(vgpu.torch.TraceError, match="aten.cumsum"):
                e(X, True)
            pooled.append(sum(len(p) for p in e.emit.free.values()))
        assert pooled[0] > 0 and pooled == pooled[:1] * 3, pooled  # reused, not allocated again
        same("after failures", e(X, False), module(X, False))
    finally:
        e.close()


def test_op_by_op_load_over_quota_leaves_nothing_charged(start_mediator) -> None:
    m = start_mediator("--tenant-memory", "8MiB")
    # 256 KiB of weights fit; the 8 MiB cache, which forward writes, does not.
    module = Fn(lambda m, x: m.cache.copy_(m.l(x).expand(8192, 256)) * 1,
                lambda m: (linear(256, 256)(m), m.register_buffer("cache", torch.zeros(8192, 256))))
    with vgpu.Client(socket=m.socket, tenant="t1") as c:
        with pytest.raises(vgpu.QuotaExceeded):
            eager(module, (randn(1, 256),), c)
        c.free(c.malloc(8 << 20))  # the whole quota is free again
