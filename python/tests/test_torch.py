"""vgpu.torch against real mediators: the example models (examples/python
gpt.py and dlrm.py) give CPU torch's results through their graphs, and
every kind of bad input is refused with an exception that says what and
where, before anything is sent where it can be."""

from __future__ import annotations

import inspect
import io
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest
import torch
import torch.nn as nn

import vgpu
import vgpu.torch
from vgpu._wire import OpArgKind

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))

import dlrm  # noqa: E402
import gpt  # noqa: E402

THIS = os.path.basename(__file__)


@pytest.fixture
def client(mediator: str) -> Iterator[vgpu.Client]:
    with vgpu.Client(socket=mediator, tenant="t1") as c:
        yield c


def line_of(obj: Any, text: str) -> str:
    """"test_torch.py:N" of the first line of obj's source that holds text."""
    lines, first = inspect.getsourcelines(obj)
    for i, line in enumerate(lines):
        if text in line:
            return f"{os.path.basename(inspect.getsourcefile(obj))}:{first + i}"
    raise AssertionError(f"{text!r} is not in the source of {obj}")


class Spy:
    """Records the client's mallocs (their hints) and the graphs it registers."""

    def __init__(self, c: vgpu.Client) -> None:
        self.mallocs: List[vgpu.Hint] = []
        self.graphs: List[vgpu.GraphDef] = []
        malloc, register = c.malloc, c.register_graph

        def spy_malloc(size: int, *a: Any, **kw: Any) -> int:
            self.mallocs.append(kw.get("hint", vgpu.Hint.NONE))
            return malloc(size, *a, **kw)

        def spy_register(g: vgpu.GraphDef) -> vgpu.TensorGraph:
            self.graphs.append(g)
            return register(g)

        c.malloc, c.register_graph = spy_malloc, spy_register


# ---- GPT: prefill and decode graphs, KV cache on the device


PROMPT = 8


def test_gpt_greedy_generation_matches_cpu(client: vgpu.Client) -> None:
    spy = Spy(client)
    model = gpt.make_model(seed=0)
    prompt = torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    r = gpt.remote_gpt(model, PROMPT, client=client)

    # One sealed allocation of weights, one of KV caches, both graphs bound to them.
    assert spy.mallocs == [vgpu.Hint.WEIGHT, vgpu.Hint.KV_CACHE]
    # The weights went through shared memory: they were copied in, and not over the socket.
    weights = sum(p.numel() * 4 for p in model.parameters())
    st = client.stats()
    assert st.copied_in >= weights and st.socket_in < weights // 10, (weights, st)
    assert [g.name for g in spy.graphs] == ["GPT.prefill", "GPT.decode"]
    caches = {}
    for g, phase in zip(spy.graphs, (vgpu.Phase.PREFILL, vgpu.Phase.DECODE)):
        assert g.scalars == ["pos"]
        assert {p for _, p, _ in g.ops} == {phase}
        by = {}
        for t in g.tensors:
            by.setdefault(t.residency, []).append(t)
        assert [(t.name, t.dtype, t.shape) for t in by[vgpu.Residency.INPUT]] == \
            [("idx", vgpu.DType.I32, (1, PROMPT if phase == vgpu.Phase.PREFILL else 1))]
        assert [(t.dtype, t.shape) for t in by[vgpu.Residency.OUTPUT]] == \
            [(vgpu.DType.F32, (1, PROMPT if phase == vgpu.Phase.PREFILL else 1, 256))]
        kv = {t.name: (t.addr, t.shape) for t in by[vgpu.Residency.KV_CACHE]}
        assert sorted(kv) == [f"blocks.{i}.{n}_cache" for i in range(2) for n in "kv"]
        caches[phase] = kv
        weights = {t.name for t in by[vgpu.Residency.WEIGHT]}
        assert {"tok.weight", "pos_emb.weight", "head.weight"} <= weights
        assert not any("mask" in w for w in weights)  # the causal mask is softmax's parameter, not a tensor
        # Each block appends to its two caches once per call, at pos (a scalar expression in both graphs).
        appends = [args for k, _, args in g.ops if k == "kv_append"]
        assert len(appends) == 4 and all(args[4] == (OpArgKind.SCALAR, 0, 1, 0) for args in appends)
    assert caches[vgpu.Phase.PREFILL] == caches[vgpu.Phase.DECODE]  # the same cache tensors, shared

    n0 = client.requests
    got, got_logits = gpt.generate(StepCounter(r, client), prompt, 32)
    assert client.requests - n0 == 32  # prefill and 31 decode steps: one request each
    want, want_logits = gpt.generate(model, prompt, 32)
    assert len(got) == 32 and got == want
    for step, (g, w) in enumerate(zip(got_logits, want_logits)):
        assert g.shape == (256,)
        diff = float((g - w).abs().max())
        assert diff < 1e-4, f"step {step}: logits differ by {diff}"
    assert len(set(got)) > 8  # the weights are such that decoding goes somewhere
    r.close()


class StepCounter:
    """Calls r, checking that every call is exactly one request and one wait."""

    def __init__(self, r: vgpu.torch.RemoteModule, c: vgpu.Client) -> None:
        self.r, self.c = r, c

    def __call__(self, *args: Any) -> Any:
        n, w = self.c.requests, self.c.waits
        out = self.r(*args)
        assert (self.c.requests - n, self.c.waits - w) == (1, 1), f"a call of {[getattr(a, 'shape', a) for a in args]}"
        return out


def test_gpt_wrong_input_shape(client: vgpu.Client) -> None:
    r = gpt.remote_gpt(gpt.make_model(seed=0), PROMPT, client=client)
    n = client.requests
    with pytest.raises(vgpu.InvalidArgument) as e:
        r(torch.zeros(1, 3, dtype=torch.long), 8)
    msg = str(e.value)
    assert "GPT" in msg and "[1, 3]" in msg and f"[1, {PROMPT}]" in msg and "[1, 1]" in msg, msg
    assert client.requests == n
    r.close()


# ---- DLRM: embedding bags, concatenation, MLPs


def test_dlrm_matches_cpu(client: vgpu.Client) -> None:
    model = dlrm.make_model(seed=0)
    batches = [dlrm.make_batch(model, seed=s) for s in range(4)]
    with vgpu.torch.remote(model, batches[0], client=client) as r:
        for b in batches:
            got = r(*b)
            with torch.no_grad():
                want = model(*b)
            assert got.shape == want.shape == (32, 1)
            diff = float((got - want).abs().max())
            assert diff < 1e-5, diff
        # Bags of other sizes are other offsets, not another graph: empty and whole bags too.
        b = list(batches[0])
        b[2] = torch.tensor([0] * 31 + [96])
        b[4] = torch.arange(32) * 3
        with torch.no_grad():
            want = model(*b)
        assert float((r(*b) - want).abs().max()) < 1e-5
        n = client.requests
        with pytest.raises(vgpu.InvalidArgument) as e:
            r(*dlrm.make_batch(model, batch=16, seed=9))
        assert "[16, 13]" in str(e.value) and "[32, 13]" in str(e.value), str(e.value)
        assert client.requests == n


# ---- bad input


class Cumsum(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.l(x), dim=-1)


class Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l(x)
        if y.sum() > 0:
            return y * 2
        return y


class RowOfIds(nn.Module):
    """Embedding bags over rows of one [tables, N] tensor of ids: a row is a
    view the device would have to copy, and int32 copies have no kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.ModuleList([nn.EmbeddingBag(10, 4, mode="sum") for _ in range(2)])

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return torch.cat([bag(ids[t], offsets[t]) for t, bag in enumerate(self.bags)], dim=1)


def refused(client: vgpu.Client, module: nn.Module, args: Tuple[Any, ...]) -> str:
    """The message of the TraceError that remote refuses module with, having
    sent nothing."""
    n = client.requests
    with pytest.raises(vgpu.torch.TraceError) as e:
        vgpu.torch.remote(module, args, client=client)
    assert client.requests == n, "requests were sent before the refusal"
    assert isinstance(e.value, vgpu.InvalidArgument)
    return str(e.value)


def test_unsupported_op_names_op_and_line(client: vgpu.Client) -> None:
    msg = refused(client, Cumsum(), (torch.randn(2, 8),))
    assert "aten.cumsum" in msg and "no kernel" in msg and line_of(Cumsum.forward, "torch.cumsum") in msg, msg


def test_data_dependent_control_flow_names_line(client: vgpu.Client) -> None:
    msg = refused(client, Branch(), (torch.randn(2, 8),))
    assert "data-dependent control flow" in msg and line_of(Branch.forward, "if y.sum() > 0") in msg, msg


def test_float64_model_or_input_names_dtype(client: vgpu.Client) -> None:
    msg = refused(client, Cumsum().double(), (torch.randn(2, 8, dtype=torch.float64),))
    assert "parameter l.weight" in msg and "torch.float64" in msg, msg
    msg = refused(client, nn.Linear(8, 8), (torch.randn(2, 8, dtype=torch.float64),))
    assert "input 0 (input)" in msg and "torch.float64" in msg, msg


def test_row_of_int_ids_is_refused_before_sending(client: vgpu.Client) -> None:
    ids, offsets = torch.randint(0, 10, (2, 6)), torch.tensor([[0, 2, 4], [0, 3, 3]])
    msg = refused(client, RowOfIds(), (ids, offsets))
    assert "int32" in msg and line_of(RowOfIds.forward, "bag(ids[t]") in msg, msg


class Square(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.l = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.l(x))


def test_mediator_killed_mid_call_is_unavailable(start_mediator) -> None:
    m = start_mediator()
    # reconnect=0: the session ends with its connection (a session that
    # waits for its mediator to come back: tests/test_resume.py).
    c = vgpu.Client(socket=m.socket, tenant="t1", reconnect=0)
    model = Square(16)
    x = torch.randn(4, 16)
    r = vgpu.torch.remote(model, (x,), client=c)
    assert float((r(x) - model(x)).abs().max()) < 1e-5
    result: List[Any] = []
    with m.frozen():
        n = c.requests
        t = threading.Thread(target=lambda: result.append(_outcome(r, x)))
        t.start()
        deadline = time.monotonic() + 10
        while c.requests == n and time.monotonic() < deadline:
            time.sleep(0.001)
        assert c.requests == n + 1  # the invocation is sent and the mediator is not answering
        time.sleep(0.05)
        assert t.is_alive()
        m.kill()
    t.join(10)
    assert not t.is_alive(), "the call still waits after the mediator died"
    assert isinstance(result[0], vgpu.Unavailable), result
    with pytest.raises(vgpu.Unavailable):
        r(x)
    r.close()
    c.close()


def _outcome(r: Any, x: torch.Tensor) -> Any:
    try:
        return r(x)
    except Exception as e:  # noqa: BLE001 - the test looks at which
        return e


class History(nn.Module):
    """A linear layer whose outputs are kept, a row per call, in a buffer
    that forward writes: a KV cache of rows x 256 float32."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.l = nn.Linear(256, 256)
        self.register_buffer("history", torch.zeros(rows, 256))

    def forward(self, x: torch.Tensor, pos: int) -> torch.Tensor:
        y = self.l(x)
        self.history[pos:pos + 1] = y
        return y


QUOTA = 8 << 20


@pytest.mark.parametrize("what", ["weights", "caches"])
def test_quota_exceeded_while_loading_leaves_nothing_charged(start_mediator, what: str) -> None:
    m = start_mediator("--tenant-memory", "8MiB")
    with vgpu.Client(socket=m.socket, tenant="t1") as c:
        spy = Spy(c)
        if what == "weights":
            # Just over 8 MiB of weights: their allocation (whole 2 MiB frames) is 10 MiB.
            module, args, hints = Square(1448), (torch.randn(1, 1448),), [vgpu.Hint.WEIGHT]
        else:
            # The weights' 2 MiB frame fits, and is uploaded and sealed; the 8 MiB cache does not.
            module, args, hints = History(QUOTA // 1024), (torch.randn(1, 256), 0), [vgpu.Hint.WEIGHT, vgpu.Hint.KV_CACHE]
        # The tenant memory cap is a quota of the session: QuotaExceeded, not
        # OutOfMemory, which is the device's own (1 GiB here) being full.
        with pytest.raises(vgpu.QuotaExceeded) as e:
            vgpu.torch.remote(module, args, client=c)
        msg = str(e.value)
        assert "exceed its memory limit of 8388608" in msg, msg
        assert spy.mallocs == hints
        if what == "caches":
            assert "(2097152 in use)" in msg, msg  # the weights were loaded when the caches failed
            assert c.stats().copied_in >= 256 * 256 * 4
        # Everything the load took is freed: the whole quota can be allocated again.
        a = c.malloc(QUOTA)
        c.free(a)


# ---- progress of the weights' upload


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stderr_tty,progress,drawn", [
    (True, None, True), (False, None, False), (True, False, False), (False, True, True)])
def test_weight_upload_progress(client: vgpu.Client, monkeypatch, stderr_tty: bool, progress: Any, drawn: bool) -> None:
    """The weights' upload draws its line on stderr when stderr is a
    terminal (or when asked), in place, ending at 100% and cleared; the
    model computes the same either way."""
    err = _Terminal() if stderr_tty else io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    model = Square(1024)  # 4 MiB of weights: several frames, several copies
    x = torch.randn(2, 1024)
    with vgpu.torch.remote(model, (x,), client=client, progress=progress) as r:
        assert float((r(x) - model(x)).abs().max()) < 1e-4
    out = err.getvalue()
    if not drawn:
        assert out == ""
        return
    assert out.count("\rvgpu.torch: weights of Square  [") >= 2, out
    assert "100%" in out and out.endswith("\r\x1b[K") and "\n" not in out, out
