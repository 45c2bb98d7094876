"""A session outlives its mediator (issue #22): the mediator, killed with
SIGKILL, is started again on the same --state-dir and socket, and the
client resumes the session on its own — device memory, host_alloc memory
and all — sending again what is safe and failing the rest with
vgpu.Interrupted.

Device memory survives only on a node of its own (an embedded one dies
with the mediator), so each test runs a vgpu-node next to the mediator.
"""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

import vgpu
from conftest import START_TIMEOUT, Mediator, mediator_binary


@pytest.fixture
def node(tmp_path: Path) -> Iterator[str]:
    """The address of a vgpu-node with 256 MiB, stopped after the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    with open(tmp_path / "node.log", "wb") as log:
        proc = subprocess.Popen([str(mediator_binary().parent / "vgpu-node"), "--listen", addr, "--devices", "1",
                                 "--memory", "256MiB", "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(addr.split(":"), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail(f"vgpu-node did not listen on {addr}:\n{(tmp_path / 'node.log').read_text()}")
                time.sleep(0.02)
        yield addr
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def restartable(node: str) -> Iterator[Callable[[], Mediator]]:
    """Starts the mediator, again and again on the same directory (socket
    and --state-dir), using the node; each start returns the new one."""
    started: list[Mediator] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-") as tmp:
        def start() -> Mediator:
            m = Mediator(Path(tmp), "--node", node)
            started.append(m)
            return m
        yield start
        for m in started:
            m.stop()


def write(c: vgpu.Client, *sizes: int) -> list[tuple[int, int, bytes]]:
    """Buffers of the sizes given, filled with random bytes: (address, size, sha256)."""
    rng = np.random.default_rng(22)
    out = []
    for n in sizes:
        p = c.malloc(n)
        data = rng.integers(0, 256, n, dtype=np.uint8)
        c.stream.copy_to_device(p, data)
        out.append((p, n, hashlib.sha256(data).digest()))
    c.stream.synchronize()
    return out


def read_sum(c: vgpu.Client, p: int, n: int) -> bytes:
    out = np.empty(n, dtype=np.uint8)
    c.stream.copy_from_device(p, out)
    c.stream.synchronize()
    return hashlib.sha256(out).digest()


def test_session_survives_mediator_kill(restartable) -> None:
    m = restartable()
    c = vgpu.Client(socket=m.socket, tenant="test")
    session = c.session
    bufs = write(c, 6 << 20, 3000)
    host = c.host_alloc(1 << 20)
    host[:] = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)[: 1 << 20]
    host_sum = hashlib.sha256(host).digest()
    m.kill()
    m = restartable()
    # Nothing done by the program: its next read resumes the session.
    for i, (p, n, want) in enumerate(bufs):
        assert read_sum(c, p, n) == want, f"buffer {i} ({n} bytes at {p:#x}) differs after the restart"
    assert c.session == session
    # The host memory kept its bytes and address, and copies through it
    # work on the resumed session (registered again, under a new id).
    assert hashlib.sha256(host).digest() == host_sum
    p = c.malloc(1 << 20)
    c.stream.copy_to_device(p, host)
    back = c.host_alloc(1 << 20)
    c.stream.copy_from_device(p, back)
    c.stream.synchronize()
    assert hashlib.sha256(back).digest() == host_sum
    c.close()


def test_in_flight_calls_after_restart(restartable) -> None:
    # Frozen, the mediator answers nothing: the calls below are in flight
    # when it is killed. The malloc may or may not have been applied: it
    # fails with Interrupted; the reads (one through host memory, whose
    # region gets a new id) are sent again and return the bytes; a stream
    # whose work in flight has a device-to-device copy fails whole.
    m = restartable()
    c = vgpu.Client(socket=m.socket, tenant="test")
    [(p, n, want)] = write(c, 1 << 20)
    host = c.host_alloc(n)
    s2, s3 = c.new_stream(), c.new_stream()
    q = c.malloc(n)
    results: dict[str, object] = {}

    def host_read() -> bytes:
        s3.copy_from_device(p, host)
        s3.synchronize()
        return hashlib.sha256(host).digest()

    def run(name: str, f: Callable[[], object]) -> None:
        try:
            results[name] = f()
        except BaseException as e:
            results[name] = e
    threads = [threading.Thread(target=run, args=("malloc", lambda: c.malloc(4096))),
               threading.Thread(target=run, args=("read", lambda: read_sum(c, p, n))),
               threading.Thread(target=run, args=("host read", host_read))]
    with m.frozen():
        s2.memset(q, 7, n)
        s2.copy_device(q, p, n)
        before = c.requests
        for t in threads:
            t.start()
        while c.requests < before + 3:  # all sent
            time.sleep(0.01)
        m.kill()
    m = restartable()
    for t in threads:
        t.join(60)
    assert isinstance(results["malloc"], vgpu.Interrupted), results
    assert isinstance(results["malloc"], vgpu.Unavailable)
    assert results["read"] == want, results
    assert results["host read"] == want, results
    with pytest.raises(vgpu.Interrupted, match="interrupted"):
        s2.synchronize()
    # The session goes on.
    assert read_sum(c, p, n) == want
    c.free(p)
    c.close()


def test_reconnect_off_and_mediator_not_back(restartable) -> None:
    m = restartable()
    off = vgpu.Client(socket=m.socket, tenant="test", reconnect=0)
    short = vgpu.Client(socket=m.socket, tenant="test", reconnect=0.5)
    off_bufs, short_bufs = write(off, 4096), write(short, 4096)
    m.kill()
    t0 = time.monotonic()
    # Lost as the reader found it, or as the send did (broken pipe).
    with pytest.raises(vgpu.Unavailable, match=re.escape(m.socket)) as e:
        read_sum(off, *off_bufs[0][:2])
    assert not isinstance(e.value, vgpu.Interrupted)
    with pytest.raises(vgpu.Unavailable, match="not back within 0.5 s"):
        read_sum(short, *short_bufs[0][:2])
    assert time.monotonic() - t0 >= 0.5
    # Once given up, a mediator that comes back does not bring the session back.
    restartable()
    with pytest.raises(vgpu.Unavailable):
        off.stats()
    off.close()
    short.close()


def test_torch_model_survives_mediator_kill(restartable) -> None:
    # A model run through vgpu.torch is a tensor graph, which the restarted
    # mediator rebuilds from the session's journal under the same id: the
    # same RemoteModule runs on, with the weights it uploaded before.
    import torch
    import torch.nn as nn

    import vgpu.torch

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.l2(torch.relu(self.l1(x)))

    torch.manual_seed(22)
    model = Net()
    x = torch.randn(4, 16)
    m = restartable()
    c = vgpu.Client(socket=m.socket, tenant="test")
    session = c.session
    r = vgpu.torch.remote(model, (x,), client=c)
    with torch.no_grad():
        assert float((r(x) - model(x)).abs().max()) < 1e-5
        m.kill()
        m = restartable()
        # A read, safe to send again, resumes the session; an invocation
        # that found the connection broken would fail vgpu.Interrupted.
        c.stats()
        assert c.session == session
        y = torch.randn(4, 16)
        assert float((r(y) - model(y)).abs().max()) < 1e-5, "the model after the restart"
    r.close()
    c.close()
