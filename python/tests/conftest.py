"""Fixtures that run a real vgpu-mediator, with its embedded sim node, in a
temporary directory, for the tests of vgpu and vgpu.torch.

The binary is $VGPU_BIN (the binary itself or the directory holding it),
else <repo>/bin/vgpu-mediator; build it first with ``make build``.

- ``mediator``: the socket path of a mediator started for the test.
- ``start_mediator``: starts one with extra flags, e.g.
  ``start_mediator("--tenant-memory", "64MiB")``, and returns a Mediator
  (``.socket``; ``.kill()`` as a crash; ``with .frozen():`` it answers
  nothing); every one is stopped after the test.

The mediators run without a quota file: any tenant name goes (a client
must still give one, e.g. ``vgpu.Client(socket=path, tenant="test")``).

Stopping sends SIGTERM and checks that the mediator exits 0 (a clean
shutdown is part of what every test checks), unless the test killed it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

START_TIMEOUT = 20.0
STOP_TIMEOUT = 20.0


def mediator_binary() -> Path:
    """The vgpu-mediator to run; fails the test with what to do if missing."""
    env = os.environ.get("VGPU_BIN")
    path = Path(env) if env else REPO / "bin"
    if path.is_dir():
        path = path / "vgpu-mediator"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"no vgpu-mediator binary at {path}: run `make build` in {REPO} "
                    "(or point $VGPU_BIN at the binary or its directory)", pytrace=False)
    return path


class Mediator:
    """A running vgpu-mediator serving tenants on ``socket``."""

    def __init__(self, workdir: Path, *flags: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(workdir / "m.sock")
        self.log = workdir / "mediator.log"
        self.killed = False
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(mediator_binary()), "--socket", self.socket, "--quota", "", "--containerd", "",
                 "--state-dir", str(workdir), "--embedded-memory", "1GiB", "--log-level", "warn", *flags],
                stdout=log, stderr=subprocess.STDOUT)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"vgpu-mediator exited {self.proc.returncode} at start:\n{self.output()}", pytrace=False)
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.02)
        self.kill()
        pytest.fail(f"vgpu-mediator did not serve {self.socket} within {START_TIMEOUT} s:\n{self.output()}",
                    pytrace=False)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """SIGSTOP the mediator, for a test of what a client does while it
        answers nothing, and SIGCONT it after. It is stopped once every
        thread is (the signal is delivered asynchronously)."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not all(_task_state(t) in "Tt" for t in Path(f"/proc/{self.proc.pid}/task").iterdir()):
                if time.monotonic() > deadline:
                    pytest.fail(f"vgpu-mediator {self.proc.pid} did not stop on SIGSTOP", pytrace=False)
                time.sleep(0.005)
            yield
        finally:
            if not self.killed:
                self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: the mediator vanishes as in a crash."""
        self.killed = True
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """SIGTERM, and check the mediator shut down cleanly."""
        if self.killed:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"vgpu-mediator ignored SIGTERM for {STOP_TIMEOUT} s:\n{self.output()}", pytrace=False)
        if rc != 0:
            pytest.fail(f"vgpu-mediator exited {rc} on SIGTERM:\n{self.output()}", pytrace=False)


def _task_state(task: Path) -> str:
    """The state letter of a thread, from /proc/<pid>/task/<tid>/stat."""
    try:
        stat = (task / "stat").read_text()
    except FileNotFoundError:  # the thread is gone
        return "T"
    return stat[stat.rindex(")") + 2]


@pytest.fixture
def start_mediator() -> Iterator[Callable[..., Mediator]]:
    """Start mediators with extra flags; all are stopped after the test.
    Their directories are short paths of their own: a Unix socket's path
    must fit in 108 bytes, which pytest's per-test directories may not."""
    started: list[Mediator] = []
    with tempfile.TemporaryDirectory(prefix="vgpu-") as tmp:
        def start(*flags: str) -> Mediator:
            m = Mediator(Path(tmp) / str(len(started)), *flags)
            started.append(m)
            return m

        yield start
        for m in started:
            m.stop()


@pytest.fixture
def mediator(start_mediator: Callable[..., Mediator]) -> str:
    """The socket of a mediator with 1 GiB of device memory and no quota file."""
    return start_mediator().socket
