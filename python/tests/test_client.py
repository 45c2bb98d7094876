"""The vgpu client against a real mediator and its embedded sim node: what
goes in comes back, kernels compute what numpy computes, errors arrive
typed and naming their value, pipelining never deadlocks, and a mediator
that vanishes shows as Unavailable."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from typing import Iterator

import numpy as np
import pytest

import vgpu

MiB = 1 << 20


@pytest.fixture
def client(mediator: str) -> Iterator[vgpu.Client]:
    with vgpu.Client(socket=mediator, tenant="test") as c:
        yield c


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail instead of hanging: a deadlock blocks in a socket call, which
    SIGALRM interrupts."""
    def expired(signum: int, frame: object) -> None:
        raise AssertionError(f"still running after {seconds} s: deadlocked?")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def rand_f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def upload(c: vgpu.Client, arr: np.ndarray, hint: vgpu.Hint = vgpu.Hint.NONE) -> int:
    addr = c.malloc(arr.nbytes, hint=hint)
    c.stream.copy_to_device(addr, arr)
    return addr


def download(c: vgpu.Client, addr: int, like: np.ndarray) -> np.ndarray:
    out = np.empty_like(like)
    c.stream.copy_from_device(addr, out)
    c.stream.synchronize()
    return out


def matmul_f32(a: np.ndarray, b: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """a × b as the catalog's kernels compute it: each product and sum
    rounded to float32, summed over k in order from 0."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for p in range(a.shape[1]):
        acc = acc + (np.float32(alpha) * a[:, p])[:, None] * b[p, :]
    return acc


def test_hello(client: vgpu.Client, mediator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert client.session > 0
    assert len(client.devices) == 1
    d = client.devices[0]
    assert d.index == 0 and d.memory == 1 << 30 and d.name
    # The defaults come from the environment, as for the Go SDK.
    monkeypatch.setenv("VGPU_SOCKET", mediator)
    monkeypatch.setenv("VGPU_TENANT", "from-env")
    with vgpu.Client() as c:
        assert c.socket == mediator and c.session != client.session
    monkeypatch.setenv("VGPU_DEVICES", "two")
    with pytest.raises(vgpu.InvalidArgument, match="VGPU_DEVICES='two'"):
        vgpu.Client()


def test_copy_round_trip(client: vgpu.Client) -> None:
    data = bytes(range(256)) * 16
    addr = client.malloc(len(data))
    client.stream.copy_to_device(addr, data)
    back = bytearray(len(data))
    client.stream.copy_from_device(addr, back)
    client.stream.synchronize()
    assert back == data

    arr = np.arange(1000, dtype=np.float32).reshape(10, 100)
    addr2 = upload(client, arr)
    np.testing.assert_array_equal(download(client, addr2, arr), arr)
    # A part of a buffer, at an offset, into a memoryview.
    part = memoryview(bytearray(40))
    client.stream.copy_from_device(addr2 + 4 * 500, part)
    client.stream.synchronize()
    np.testing.assert_array_equal(np.frombuffer(part, np.float32), arr.reshape(-1)[500:510])


def test_copies_larger_than_a_frame(client: vgpu.Client) -> None:
    rng = np.random.default_rng(1)
    n = 3 * MiB + 12345
    data = rng.integers(0, 256, n, dtype=np.uint8)
    before = client.stats()
    addr = upload(client, data)
    back = download(client, addr, data)
    after = client.stats()
    np.testing.assert_array_equal(back, data)
    # Not through shared memory: these bytes crossed the socket, in frames
    # of at most 1 MiB.
    assert after.socket_in - before.socket_in >= n
    assert after.socket_out - before.socket_out >= n
    assert after.copied_in - before.copied_in == n


def test_host_alloc_copies_bypass_the_socket(client: vgpu.Client) -> None:
    rng = np.random.default_rng(2)
    n = 4 * MiB
    host = client.host_alloc(2 * n)
    assert host.dtype == np.uint8 and host.nbytes == 2 * n
    src, dst = host[:n], host[n:]
    src[:] = rng.integers(0, 256, n, dtype=np.uint8)
    addr = client.malloc(n)
    before = client.stats()
    client.stream.copy_to_device(addr, src)
    client.stream.copy_from_device(addr, dst)  # at an offset of the region
    client.stream.synchronize()
    after = client.stats()
    np.testing.assert_array_equal(dst, src)
    assert after.copied_in - before.copied_in == n
    assert after.copied_out - before.copied_out == n
    assert after.socket_in - before.socket_in < 64 << 10, "the payload crossed the socket"
    assert after.socket_out - before.socket_out < 64 << 10, "the payload crossed the socket"
    # A typed view of the region is found as well.
    floats = src.view(np.float32)
    client.stream.copy_to_device(addr, floats[:1024])
    client.stream.synchronize()
    assert client.stats().socket_in - after.socket_in < 4096

    client.host_free(host)
    with pytest.raises(vgpu.InvalidArgument, match="not memory of host_alloc"):
        client.host_free(host)
    # Freed memory is ordinary memory again: copies from it use the socket.
    before = client.stats()
    client.stream.copy_to_device(addr, src)
    client.stream.synchronize()
    assert client.stats().socket_in - before.socket_in >= n


def test_saxpy(client: vgpu.Client) -> None:
    rng = np.random.default_rng(3)
    x, y = rand_f32(rng, 5000), rand_f32(rng, 5000)
    px, py = upload(client, x), upload(client, y)
    client.stream.launch("saxpy", len(x), 2.5, vgpu.Ptr(px), vgpu.Ptr(py))
    np.testing.assert_array_equal(download(client, py, y), np.float32(2.5) * x + y)
    # The explicit argument types mean the same.
    client.stream.launch("saxpy", vgpu.I64(len(x)), vgpu.F32(-1.0), vgpu.Ptr(px), vgpu.Ptr(py))
    np.testing.assert_array_equal(download(client, py, y), (np.float32(2.5) * x + y) + np.float32(-1.0) * x)


def test_sgemm(client: vgpu.Client) -> None:
    rng = np.random.default_rng(4)
    m, n, k = 17, 33, 29
    a, b, c0 = rand_f32(rng, m, k), rand_f32(rng, k, n), rand_f32(rng, m, n)
    pa, pb, pc = upload(client, a), upload(client, b), upload(client, c0)
    alpha, beta = 0.75, 0.5
    client.stream.launch("sgemm", m, n, k, alpha, vgpu.Ptr(pa), vgpu.Ptr(pb), beta, vgpu.Ptr(pc))
    want = np.float32(beta) * c0
    for p in range(k):
        want = want + (np.float32(alpha) * a[:, p])[:, None] * b[p, :]
    np.testing.assert_array_equal(download(client, pc, c0), want)


def test_memset_and_copy_device(client: vgpu.Client) -> None:
    n = 3 * MiB
    a, b = client.malloc(n), client.malloc(n)
    client.stream.memset(a, 0xAB, n)
    client.stream.memset(a + 100, 0x01, 10)
    client.stream.copy_device(b, a, n)
    back = np.empty(n, np.uint8)
    client.stream.copy_from_device(b, back)
    client.stream.synchronize()
    want = np.full(n, 0xAB, np.uint8)
    want[100:110] = 1
    np.testing.assert_array_equal(back, want)


def test_streams(client: vgpu.Client) -> None:
    s1, s2 = client.new_stream(), client.new_stream()
    assert len({client.stream.id, s1.id, s2.id}) == 3
    a, b = client.malloc(4096), client.malloc(4096)
    s1.memset(a, 1, 4096)
    s2.memset(b, 2, 4096)
    s1.synchronize()
    s2.synchronize()
    out = np.empty(4096, np.uint8)
    s2.copy_from_device(a, out)
    s2.synchronize()
    assert (out == 1).all()
    s1.destroy()
    s1.memset(a, 3, 16)  # a stream that no longer exists
    with pytest.raises(vgpu.InvalidArgument, match=f"stream {s1.id}"):
        s1.synchronize()
    with pytest.raises(vgpu.InvalidArgument, match="default stream"):
        client.stream.destroy()
    s2.destroy()


def test_kernels_lists_matmul(client: vgpu.Client) -> None:
    kernels = {k.name: k for k in client.kernels()}
    assert {"matmul", "saxpy", "sgemm", "add"} <= kernels.keys()
    mm = kernels["matmul"]
    assert "matrix product" in mm.doc.lower()
    params = {p.name: p for p in mm.params}
    assert [p.name for p in mm.params] == ["batch", "m", "n", "k", "trans_a", "trans_b", "b_batch", "a", "b", "c"]
    assert params["m"].kind == vgpu.ArgKind.I64 and params["m"].dtype is None
    assert params["a"] == vgpu.Param("a", vgpu.ArgKind.BUFFER, vgpu.Access.READ, 4, ("batch", "m", "k"), vgpu.DType.F32)
    assert params["c"].access == vgpu.Access.WRITE
    assert kernels["argmax"].params[-1].dtype == vgpu.DType.I32


def test_typed_errors(client: vgpu.Client) -> None:
    bad = 0x7777_0000_1000
    with pytest.raises(vgpu.InvalidAddress, match=f"{bad:#x}") as e:
        client.free(bad)
    assert e.value.code == 3 and isinstance(e.value, vgpu.VgpuError)
    with pytest.raises((vgpu.OutOfMemory, vgpu.QuotaExceeded)):
        client.malloc(2 << 30)
    # Errors of pipelined work surface at synchronize, the first one sent
    # first; the stream goes on working after.
    x = client.malloc(64)
    client.stream.launch("no_such_kernel", vgpu.Ptr(x))
    client.stream.launch("fill_f32", vgpu.Ptr(x), 16, 1.0)
    client.stream.launch("no_such_kernel_either", vgpu.Ptr(x))
    with pytest.raises(vgpu.UnknownKernel, match='"no_such_kernel"'):
        client.stream.synchronize()
    client.stream.synchronize()  # the error was reported once
    np.testing.assert_array_equal(download(client, x, np.empty(16, np.float32)), np.ones(16, np.float32))
    # A device address passed as an int is an i64: the kernel refuses it.
    client.stream.launch("fill_f32", x, 16, 1.0)
    with pytest.raises(vgpu.InvalidArgument):
        client.stream.synchronize()


def test_client_side_validation(client: vgpu.Client) -> None:
    x = client.malloc(64)
    sent = client.requests
    with pytest.raises(vgpu.InvalidArgument, match="'sixteen'"):
        client.stream.launch("fill_f32", vgpu.Ptr(x), "sixteen", 1.0)
    with pytest.raises(vgpu.InvalidArgument, match="None"):
        client.stream.launch("fill_f32", vgpu.Ptr(x), 16, None)
    with pytest.raises(vgpu.InvalidArgument, match="-5"):
        client.malloc(-5)
    with pytest.raises(vgpu.InvalidArgument, match="-1"):
        client.stream.memset(x, 0, -1)
    with pytest.raises(vgpu.InvalidArgument, match="-1"):
        vgpu.Ptr(-1)
    with pytest.raises(vgpu.InvalidArgument, match=str(1 << 70)):
        client.stream.launch("fill_f32", vgpu.Ptr(x), 1 << 70, 1.0)
    with pytest.raises(vgpu.InvalidArgument, match="C-contiguous"):
        client.stream.copy_to_device(x, np.zeros((4, 4), np.float32)[:, :2])
    with pytest.raises(vgpu.InvalidArgument, match="read-only"):
        client.stream.copy_from_device(x, b"\0" * 16)
    with pytest.raises(vgpu.InvalidArgument, match="0 bytes"):
        client.stream.copy_to_device(x, b"")
    with pytest.raises(vgpu.InvalidArgument, match="residency hint"):
        client.malloc(64, hint=99)
    assert client.requests == sent, "a refused call sent a request"
    client.stream.synchronize()


def test_no_socket_is_unavailable(tmp_path) -> None:
    path = str(tmp_path / "none.sock")
    with pytest.raises(vgpu.Unavailable, match=re.escape(path)):
        vgpu.Client(socket=path, tenant="test")


def test_mediator_killed_mid_session(start_mediator) -> None:
    m = start_mediator()
    c = vgpu.Client(socket=m.socket, tenant="test", reconnect=0)  # as test_pending_calls_fail_...
    x = c.malloc(4096)
    for _ in range(100):
        c.stream.memset(x, 1, 4096)
    m.kill()
    with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
        c.malloc(4096)
    with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
        c.malloc(4096)
    with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
        c.stream.memset(x, 1, 4096)
    with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
        c.stream.synchronize()
    with pytest.raises(vgpu.Unavailable):
        c.stream.synchronize()
    c.close()


def test_pending_calls_fail_when_the_mediator_dies(start_mediator) -> None:
    # reconnect=0: the session ends with its connection (test_resume.py
    # has the session that waits for its mediator to come back).
    m = start_mediator()
    c = vgpu.Client(socket=m.socket, tenant="test", reconnect=0)
    x = c.malloc(4096)
    failed: list[BaseException] = []

    def call() -> None:
        try:
            c.malloc(4096)
        except BaseException as e:
            failed.append(e)
    t = threading.Thread(target=call)
    # Frozen, the mediator answers nothing: every request below is still
    # pending when it dies.
    with m.frozen():
        for _ in range(100):
            c.stream.memset(x, 1, 4096)
        t.start()
        while c.requests < 102:  # the thread's malloc is sent
            time.sleep(0.01)
        m.kill()
    with deadline(60):
        with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
            c.stream.synchronize()
        t.join()
    assert len(failed) == 1 and isinstance(failed[0], vgpu.Unavailable), failed
    c.close()


def test_tenant_memory_cap(start_mediator) -> None:
    m = start_mediator("--tenant-memory", "64MiB")
    with vgpu.Client(socket=m.socket, tenant="capped") as c:
        c.malloc(48 * MiB, hint=vgpu.Hint.WEIGHT)
        with pytest.raises(vgpu.QuotaExceeded):
            c.malloc(48 * MiB, hint=vgpu.Hint.WEIGHT)


def test_timeout_gives_up_on_a_silent_mediator(start_mediator) -> None:
    m = start_mediator()
    c = vgpu.Client(socket=m.socket, tenant="test", timeout=0.5)
    c.malloc(4096)
    with m.frozen():
        with pytest.raises(vgpu.Unavailable, match="did not answer malloc within 0.5 s"):
            c.malloc(4096)
        with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)):
            c.stream.synchronize()
    c.close()


def test_timeout_bounds_a_send_the_mediator_does_not_read(start_mediator) -> None:
    # 64 MiB do not fit the socket's buffer: the copy's frames wait for the
    # mediator to read them, and the timeout bounds that wait too.
    m = start_mediator()
    c = vgpu.Client(socket=m.socket, tenant="test", timeout=0.5)
    a = c.malloc(64 * MiB)
    with m.frozen():
        start = time.monotonic()
        with pytest.raises(vgpu.Unavailable, match="it read nothing for 0.5 s"):
            c.stream.copy_to_device(a, np.ones(64 * MiB, dtype=np.uint8))
        assert time.monotonic() - start < 10
        with pytest.raises(vgpu.Unavailable):
            c.malloc(4096)
    c.close()


def test_pipelined_launches_never_deadlock(client: vgpu.Client) -> None:
    # Past 16 384 requests in flight the mediator stops reading until
    # replies are read: a client that read them only at synchronize would
    # hang here.
    n = 200_000
    x = client.malloc(64)
    before, sent, waits = client.stats(), client.requests, client.waits
    start = time.monotonic()
    with deadline(120):
        for _ in range(n):
            client.stream.launch("fill_f32", vgpu.Ptr(x), 1, 2.0)
        client.stream.synchronize()
    took = time.monotonic() - start
    assert client.requests - sent == n
    assert client.waits - waits == 1
    assert client.stats().launches - before.launches == n
    print(f"{n} pipelined launches: {took:.1f} s")


def build_graph(w_addr: int, b_addr: int, bad_kernel: bool = False) -> vgpu.GraphDef:
    """out = x × w + b, and row = out[pos - 1], with w (3×4) and b (1×4)
    weights in one sealed allocation."""
    g = vgpu.GraphDef("affine")
    pos = g.scalar("pos")
    x = g.input("x", vgpu.DType.F32, (2, 3))
    w = g.weight("w", vgpu.DType.F32, w_addr, (3, 4))
    b = g.weight("b", vgpu.DType.F32, b_addr, (1, 4))
    h = g.activation("h", vgpu.DType.F32, (2, 4))
    out = g.output("out", vgpu.DType.F32, (2, 4))
    row = g.output("row", vgpu.DType.I32 if bad_kernel else vgpu.DType.F32, (1, 4))
    g.op(vgpu.Phase.FORWARD, "matmul", 1, 2, 4, 3, 0, 0, 1, x, w, h)
    g.op(vgpu.Phase.FORWARD, "add", 2, 4, 1, h, b, out)
    g.op(vgpu.Phase.DECODE, "slice" if not bad_kernel else "slice_f64", 1, 2, 4, pos - 1, 1, out, row)
    return g


def test_graph_register_invoke_release(client: vgpu.Client) -> None:
    rng = np.random.default_rng(5)
    w, b = rand_f32(rng, 3, 4), rand_f32(rng, 1, 4)
    params = np.concatenate([w.reshape(-1), b.reshape(-1)])
    base = upload(client, params, vgpu.Hint.WEIGHT)
    client.seal(base)
    g = build_graph(base, base + w.nbytes)
    with pytest.raises(vgpu.UnknownKernel, match="slice_f64"):
        client.register_graph(build_graph(base, base + w.nbytes, bad_kernel=True))
    tg = client.register_graph(g)
    assert tg.name == "affine" and tg.scalars == ("pos",)
    assert [(i.name, i.dtype, i.shape, i.nbytes) for i in tg.inputs] == [("x", vgpu.DType.F32, (2, 3), 24)]
    assert [i.name for i in tg.outputs] == ["out", "row"]

    for pos in (1, 2):
        x = rand_f32(rng, 2, 3)
        sent, waits = client.requests, client.waits
        out, row = tg.invoke([pos], x)
        assert (client.requests - sent, client.waits - waits) == (1, 1), "an invocation is one round trip"
        want = matmul_f32(x, w) + b
        assert out.dtype == np.float32 and out.shape == (2, 4) and row.shape == (1, 4)
        np.testing.assert_array_equal(out, want)
        np.testing.assert_array_equal(row[0], want[pos - 1])
    # Raw bytes do as well as an array.
    np.testing.assert_array_equal(tg.invoke([1], x.tobytes())[0], out)

    with pytest.raises(vgpu.InvalidArgument, match=r"input tensor 0 \(x\) holds 24 bytes, got 20"):
        tg.invoke([1], np.zeros(5, np.float32))
    with pytest.raises(vgpu.InvalidArgument, match=r"input tensor 0 \(x\) is f32, got an array of float64"):
        tg.invoke([1], np.zeros(3, np.float64))
    with pytest.raises(vgpu.InvalidArgument, match="takes 1 scalars"):
        tg.invoke([], x)
    with pytest.raises(vgpu.InvalidArgument, match="slice"):
        tg.invoke([5], x)  # start 4 of 2 rows: refused by the mediator

    client.stream.copy_to_device(base, b"\0" * 4)
    with pytest.raises(vgpu.PermissionDenied, match="sealed"):
        client.stream.synchronize()
    with pytest.raises(vgpu.InvalidArgument, match='"affine"'):
        client.free(base)  # the graph binds it
    tg.release()
    client.free(base)


def test_graph_builder_refusals() -> None:
    g = vgpu.GraphDef("g")
    with pytest.raises(vgpu.InvalidArgument, match=r"tensor 0 \(w, weight\): no allocation"):
        g.weight("w", vgpu.DType.F32, 0, (4,))
    with pytest.raises(vgpu.InvalidArgument, match=r"shape \[2, 0\]"):
        g.input("x", vgpu.DType.F32, (2, 0))
    with pytest.raises(vgpu.InvalidArgument, match="5 dimensions"):
        g.input("x", vgpu.DType.F32, (1, 1, 1, 1, 1))
    x = g.input("x", vgpu.DType.F32, (4,))
    other = vgpu.GraphDef("other").input("y", vgpu.DType.F32, (4,))
    with pytest.raises(vgpu.InvalidArgument, match="graph 'other'"):
        g.op(vgpu.Phase.OTHER, "relu", 4, other, x)
    with pytest.raises(vgpu.InvalidArgument, match="'four'"):
        g.op(vgpu.Phase.OTHER, "relu", "four", x, x)
    s = g.scalar("pos")
    assert s * 3 + 2 == vgpu.ScalarExpr(0, 3, 2)
    assert 2 * (s - 1) == vgpu.ScalarExpr(0, 2, -2)
    with pytest.raises(vgpu.InvalidArgument, match="2.5"):
        s * 2.5
