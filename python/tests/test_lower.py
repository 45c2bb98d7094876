"""Unit tests of vgpu.torch's capture and lowering that need no mediator:
the view algebra against torch's own, the fit of integers to scalar
expressions, and what a capture leaves of the module."""

import os
import random

import pytest

torch = pytest.importorskip("torch") if not os.environ.get("VGPU_REQUIRE_TORCH") else __import__("torch")

from vgpu.torch.capture import TraceError, capture  # noqa: E402
from vgpu.torch.lower import Affine, Const, Emitter, Handle, Lowerer, contiguous_strides, view_strides  # noqa: E402
from vgpu.torch.remote import _Fit  # noqa: E402


def _factor(n, rng):
    """A random shape of n elements."""
    dims = []
    while n > 1:
        d = rng.choice([k for k in range(2, n + 1) if n % k == 0])
        dims.append(d)
        n //= d
    rng.shuffle(dims)
    for _ in range(rng.randint(0, 2)):
        dims.insert(rng.randint(0, len(dims)), 1)
    return dims or [1]


def test_view_strides_agree_with_torch():
    rng = random.Random(7)
    views = refusals = 0
    for _ in range(3000):
        n = rng.choice([1, 6, 8, 12, 24, 36, 48])
        shape = _factor(n, rng)
        x = torch.arange(n).reshape(shape)
        if len(shape) > 1 and rng.random() < 0.6:
            perm = list(range(len(shape)))
            rng.shuffle(perm)
            x = x.permute(perm)
        new = _factor(n, rng)
        got = view_strides(tuple(x.shape), tuple(x.stride()), tuple(new))
        try:
            want = x.view(new).stride()
        except RuntimeError:
            want = None
        if want is None:
            refusals += 1
            assert got is None, (list(x.shape), x.stride(), new)
        else:
            views += 1
            # Strides of size-1 dimensions are free; torch and we may differ there.
            assert got is not None, (list(x.shape), x.stride(), new)
            assert [g for g, d in zip(got, new) if d != 1] == [w for w, d in zip(want, new) if d != 1]
    assert views > 500 and refusals > 100  # both branches were exercised


def test_contiguous_strides():
    assert contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert contiguous_strides(()) == ()


def test_fit_finds_affine_expressions_and_refuses_others():
    # Runs: base pos=5; pos=6, pos=7 (scalar 0); n=3 then n=4, 5 (scalar 1).
    values = [[5, 3], [6, 3], [7, 3], [5, 4], [5, 5]]
    fit = _Fit(values, {0: [1, 2], 1: [3, 4]}, ["pos", "n"])
    assert fit([9, 9, 9, 9, 9], "c") == Affine(None, 0, 9)
    assert fit([5, 6, 7, 5, 5], "start") == Affine(0, 1, 0)
    assert fit([17, 19, 21, 17, 17], "offset") == Affine(0, 2, 7)
    assert fit([1, 1, 1, 4, 7], "len") == Affine(1, 3, -8)
    with pytest.raises(TraceError, match="not an affine function of pos"):
        fit([25, 36, 50, 25, 25], "square")
    with pytest.raises(TraceError, match="two integer arguments, pos and n"):
        fit([8, 9, 10, 9, 10], "sum")


class _Cache(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(4, 3))
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x, pos: int):
        self.cache[pos:pos + 1] = x * self.scale
        return self.cache.sum(0)


def test_capture_leaves_the_module_as_it_was_and_finds_the_written_buffer():
    m = _Cache()
    tr = capture(m, (torch.ones(1, 3), 2))
    assert torch.equal(m.cache, torch.zeros(4, 3))  # the run wrote a clone
    assert torch.equal(tr.buffers["cache"][2], torch.full((3,), 2.0))  # ... which it did write
    assert set(tr.mutated) == {"cache"}
    assert "test_lower.py" in tr.mutated["cache"] and "self.cache[pos:pos + 1] = x * self.scale" in tr.mutated["cache"]


class _Uploads(Emitter):
    """Records the first value of each constant uploaded, and keeps no tensor
    (as vgpu.torch.eager's emitter does not)."""

    def constant(self, name, value):
        h = Handle(name, "f32", value.numel(), "weight")
        h.first = float(value.flatten()[0])
        return h


def test_each_constant_is_uploaded_as_itself():
    # Constants a rule makes (layer_norm's ones and zeros) die as it returns;
    # a later one at the same address must not be taken for them.
    L = Lowerer(_Uploads(), None)
    got = [L.as_dev(Const([torch.full((4,), float(i))]), "c").base.first for i in range(20)]
    assert got == [float(i) for i in range(20)]
