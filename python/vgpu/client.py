"""A session with the mediator: the connection, device memory, host memory
shared with the mediator, and streams.

The connection carries pipelined requests: each frame has an id and its
reply names it, in whatever order the mediator answers. A reader thread
reads every reply as it arrives and hands it to whoever sent the request,
so the mediator, which stops reading a socket whose replies are not read
(16 384 requests in flight), always finds them read: a caller may send
any number of stream operations without waiting and never deadlocks.
Requests go out at once, in call order, so a call the mediator orders
after earlier stream work (free, seal, a graph's registration or
invocation) finds that work sent.

Stream operations do not wait: Stream.synchronize waits for all of a
stream's replies and raises the first error among them. Other calls wait
for their own reply. ``Client.requests`` counts requests sent and
``Client.waits`` the times a caller blocked for replies, so a caller can
check what a piece of work cost in round trips.

Reconnecting (as the Go SDK does, client/reconnect.go): the hello asks for
a session token. When the connection breaks, the reader thread dials the
socket again for up to ``reconnect`` seconds and resumes the session with
the token (a mediator with a --state-dir rebuilt it, device memory and
all); meanwhile new requests wait. It registers the host regions again
(the restart forgot them: each moves onto a new memfd at the same address,
bytes kept, since the old one is sealed against a writable mapping) and
then deals with the requests that were in flight: those whose repeat
cannot change the outcome (SAFE_OPS: reads, copies through host_alloc
memory, memsets) are sent again, in their order; the others fail with
Interrupted. A stream's requests in flight are one unit, like a Go batch:
one unsafe among them fails them all. A copy to the device from plain
bytes is not safe here (unlike Go, which holds the bytes in its batch):
the caller may have reused its buffer once the call returned.
"""

from __future__ import annotations

import array
import ctypes
import errno
import fcntl
import mmap
import numbers
import os
import socket as _socket
import struct
import threading
import time
import weakref
from typing import Callable, Sequence

import numpy as np

from . import _wire as w
from ._values import address, byte_view, data_address, integer, positive
from .errors import (InternalError, Interrupted, InvalidArgument, OutOfMemory, ProtocolError, Unavailable,
                     VgpuError)
from .graph import GraphDef, TensorGraph

DEFAULT_SOCKET = "/run/vgpu/mediator.sock"
DEFAULT_RECONNECT = 60.0  # seconds, as client.DefaultReconnect

# Requests that may be sent again after the connection broke while they were
# in flight: sending them twice leaves what once would (docs/architecture.md).
SAFE_OPS = frozenset({w.Op.KERNELS, w.Op.SESSION_STATS, w.Op.COPY_FROM_DEVICE, w.Op.MEMSET,
                      w.Op.COPY_TO_DEVICE_HOST, w.Op.COPY_FROM_DEVICE_HOST})
_REGION_AT = 12  # where api.CopyHost's region id lies in its body


class Arg:
    """A kernel argument as the wire carries it: a kind and 64 bits."""

    __slots__ = ("kind", "bits", "value")

    def __init__(self, kind: w.ArgKind, fmt: str, value: int | float, what: str) -> None:
        try:
            raw = struct.pack(fmt, value)
        except (struct.error, OverflowError) as e:
            raise InvalidArgument(f"{what} {value!r} is out of range: {e}") from None
        self.kind = kind
        self.bits = int.from_bytes(raw, "little")
        self.value = value

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.bits == self.bits

    def __hash__(self) -> int:
        return hash((self.kind, self.bits))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value!r})"


class Ptr(Arg):
    """A device address, passed to a kernel's buffer parameter. An int is
    an i64, never an address: a kernel that takes a buffer needs a Ptr."""

    __slots__ = ()

    def __init__(self, addr: int) -> None:
        super().__init__(w.ArgKind.BUFFER, "<Q", address(addr, "device address"), "device address")

    @property
    def addr(self) -> int:
        return self.bits

    def __index__(self) -> int:
        return self.bits

    def __add__(self, off: int) -> Ptr:
        return Ptr(self.bits + integer(off, "pointer offset"))

    def __repr__(self) -> str:
        return f"Ptr({self.bits:#x})"


class I64(Arg):
    """An explicit i64 kernel argument (a plain int means the same)."""

    __slots__ = ()

    def __init__(self, v: int) -> None:
        super().__init__(w.ArgKind.I64, "<q", integer(v, "i64 argument"), "i64 argument")


class F32(Arg):
    """An explicit f32 kernel argument (a plain float means the same)."""

    __slots__ = ()

    def __init__(self, v: float) -> None:
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise InvalidArgument(f"f32 argument {v!r} is not a real number")
        super().__init__(w.ArgKind.F32, "<f", float(v), "f32 argument")


def _kernel_arg(kernel: str, i: int, a: object) -> tuple[int, int]:
    """Argument i of a launch as (kind, bits)."""
    if isinstance(a, Arg):
        return a.kind, a.bits
    # The exact types first: the numbers ABCs' checks are slow, and a
    # launch's arguments are on the path of every kernel.
    if type(a) is int or isinstance(a, numbers.Integral) and not isinstance(a, bool):
        a = I64(a)
    elif type(a) is float or isinstance(a, numbers.Real) and not isinstance(a, bool):
        a = F32(a)
    else:
        raise InvalidArgument(f"launch of {kernel}: argument {i} {a!r} ({type(a).__name__}) is not "
                              "a vgpu.Ptr (device address), an int (i64) or a float (f32)")
    return a.kind, a.bits


class _Reader:
    """Buffered reads of the socket, for the reader thread only."""

    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray(1 << 16)
        self.mv = memoryview(self.buf)
        self.lo = self.hi = 0

    def _recv(self, into: memoryview) -> int:
        n = self.sock.recv_into(into)
        if n == 0:
            raise EOFError("the mediator closed the connection")
        return n

    def exact(self, n: int) -> bytes | bytearray:
        """The next n bytes."""
        if n > len(self.buf):
            out = bytearray(n)
            self.into(memoryview(out))
            return out
        while self.hi - self.lo < n:
            if len(self.buf) - self.lo < n:  # move what is left to the front
                k = self.hi - self.lo
                self.buf[:k] = self.mv[self.lo:self.hi]
                self.lo, self.hi = 0, k
            self.hi += self._recv(self.mv[self.hi:])
        b = bytes(self.mv[self.lo:self.lo + n])
        self.lo += n
        return b

    def into(self, out: memoryview) -> None:
        """Fill out, straight from the socket past what is buffered."""
        k = min(len(out), self.hi - self.lo)
        out[:k] = self.mv[self.lo:self.lo + k]
        self.lo += k
        while k < len(out):
            k += self._recv(out[k:])

    def skip(self, n: int) -> None:
        """Discard the next n bytes."""
        while n:
            k = min(n, len(self.buf))
            self.exact(k)
            n -= k


class _Call:
    """A request whose caller waits for its reply."""

    __slots__ = ("into", "body", "error", "event")

    def __init__(self, into: memoryview | None) -> None:
        self.into = into
        self.body: bytes | bytearray | None = None
        self.error: VgpuError | None = None
        self.event = threading.Event()

    def done(self, rid: int, body: bytes | bytearray | None, error: VgpuError | None) -> None:
        self.body, self.error = body, error
        self.event.set()


# A request in flight: (op, parts, entry, region), kept until its reply so
# that it can be sent again on a resumed session; region is the host region
# whose id its body carries at _REGION_AT. A tuple: one is made per request.
_Req = tuple


def _handshake(path: str, tenant: str, devices: int, resume: str | None,
               timeout: float | None) -> tuple[_socket.socket, int, list[w.DeviceInfo], str]:
    """Connect to the mediator and say hello (resume: see w.encode_hello);
    returns the socket, session id, devices and token."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        body = w.encode_hello(tenant, devices, resume)
        sock.sendall(w.HEADER.pack(len(body), w.Op.HELLO, 0, 1) + body)
        r = _Reader(sock)
        n, _, flags, _ = w.HEADER.unpack(r.exact(w.HEADER_SIZE))
        if n > w.MAX_BODY:
            raise ProtocolError(f"mediator at {path}: hello reply announces a {n}-byte body, limit {w.MAX_BODY}")
        body = r.exact(n)
        if flags & w.FLAG_ERROR:
            raise w.decode_error(body)
        session, infos, token = w.decode_hello_reply(body)
        if r.hi != r.lo:
            raise ProtocolError(f"mediator at {path} sent more than its hello reply")
        sock.settimeout(None)
        return sock, session, infos, token
    except (OSError, EOFError) as e:
        sock.close()
        raise Unavailable(f"connect to mediator at {path}: {e}") from None
    except VgpuError:
        sock.close()
        raise


class _Conn:
    """One session's connection: sends frames, reads replies on a thread
    and hands each to the entry its request registered (an object with
    ``into``, where the body goes or None, and ``done(rid, body, error)``).
    When the socket breaks and the session has a token, the reader thread
    resumes the session on a new socket (_resume) and a new reader thread
    takes over.

    Every entry registered gets exactly one done, from the reader, from
    fail or _resume, or at once if the connection had already failed.
    _wlock (held while a frame is written, which may block until the
    mediator reads) and _lock (the socket, the pending table, the resume
    state; _gate waits on it) are never held together, and entries' own
    locks are taken under neither: the reader thread never waits for a
    writer, so replies are read however full the socket is.
    """

    def __init__(self, sock: _socket.socket, path: str, timeout: float | None, hello: tuple[str, int],
                 token: str, reconnect: float, rehost: Callable[[], None]) -> None:
        self.path = path
        self.timeout = timeout
        self.requests = 0
        self.waits = 0
        self._hello = hello  # tenant and devices, to resume with
        self._reconnect = reconnect
        self._rehost = rehost  # registers the host regions again, on a resumed session
        self._lock = threading.Lock()
        self._gate = threading.Condition(self._lock)  # resuming ended
        self._wlock = threading.Lock()
        self._pending: dict[int, _Req] = {}  # guarded by _lock
        self._next = 1  # the hello was 1; guarded by _lock
        self._failed: tuple[type[VgpuError], str] | None = None  # guarded by _lock
        self._token = token  # "": the session cannot be resumed; guarded by _lock
        self._resuming = False  # guarded by _lock
        self.sock = sock  # guarded by _lock
        self._start(sock)

    def _start(self, sock: _socket.socket) -> None:
        """Serve sock: bound its sends, start its reader thread."""
        if self.timeout is not None:
            # A mediator that stops reading blocks a send once the socket's
            # buffer is full (a large copy): bound that as a wait for replies.
            sec, usec = divmod(max(1, round(self.timeout * 1e6)), 1_000_000)  # 0 would be no bound
            sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_SNDTIMEO, struct.pack("@ll", sec, usec))
        self._reader = threading.Thread(target=self._read_loop, args=(sock,), name=f"vgpu reader {self.path}",
                                        daemon=True)
        self._reader.start()

    def error(self) -> VgpuError | None:
        """A fresh exception for the failure that ended the connection, if any."""
        failed = self._failed
        return failed[0](failed[1]) if failed else None

    def send(self, op: w.Op, parts: Sequence[object], entry, fd: int | None = None, region=None,
             resuming: bool = False) -> None:
        """Send a request whose body is parts, its reply going to entry;
        fd, if given, travels with it (SCM_RIGHTS); region is the host
        region whose id the body carries. Waits while the session is being
        resumed, unless this is part of resuming it. Raises the
        connection's failure if it could not be sent; entry then has it too."""
        size = sum(memoryview(p).nbytes for p in parts)
        with self._lock:
            while self._resuming and not resuming and self._failed is None:
                self._gate.wait()
            self._next += 1
            rid = self._next
            err = self.error()
            if err is None:
                if region is not None:  # its id on this connection
                    struct.pack_into("<I", parts[0], _REGION_AT, region.id)
                self._pending[rid] = (op, parts, entry, region if fd is None else None)
                self.requests += 1
            sock = self.sock
        if err is not None:
            entry.done(rid, None, err)
            raise self.error()
        hdr = w.HEADER.pack(size, op, 0, rid)
        try:
            with self._wlock:
                if fd is None:
                    self._sendall(sock, [hdr, *parts])
                else:
                    self._send_fd(sock, hdr + b"".join(parts), fd)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):  # SO_SNDTIMEO ran out
                e = f"it read nothing for {self.timeout} s; connection closed"
            elif self._token and self._reconnect > 0:
                return  # the reader finds the socket broken and resumes, dealing with this request
            self.fail(Unavailable(f"send {op.name.lower()} to mediator at {self.path}: {e}"))
            raise self.error() from None

    @staticmethod
    def _sendall(sock: _socket.socket, parts: Sequence[object]) -> None:
        bufs = [memoryview(p).cast("B") for p in parts if memoryview(p).nbytes]
        while bufs:
            n = sock.sendmsg(bufs[:512])
            while n:
                if n >= len(bufs[0]):
                    n -= len(bufs.pop(0))
                else:
                    bufs[0], n = bufs[0][n:], 0

    @staticmethod
    def _send_fd(sock: _socket.socket, frame: bytes, fd: int) -> None:
        n = sock.sendmsg([frame], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", [fd]))])
        # A stream socket may take part of the frame (the descriptor goes
        # with that part); the rest follows as plain bytes.
        sock.sendall(frame[n:])

    def call(self, op: w.Op, parts: Sequence[object], into: memoryview | None = None, fd: int | None = None,
             resuming: bool = False):
        """Send a request and wait for its reply body."""
        c = _Call(into)
        self.send(op, parts, c, fd, resuming=resuming)
        self.wait(c.event.wait, op.name.lower())
        if c.error is not None:
            raise c.error
        return c.body

    def wait(self, ready: Callable[[float | None], bool], what: str) -> None:
        """Block until ready(timeout) is true, counting one wait. Past the
        client's timeout the connection is closed, which completes every
        request: a late reply must not be taken for a later request's.
        While the session is being resumed the wait goes on: resuming is
        bounded by its own deadline."""
        with self._lock:
            self.waits += 1
        while not ready(self.timeout):
            if self._resuming:
                continue
            self.fail(Unavailable(f"mediator at {self.path} did not answer {what} within "
                                  f"{self.timeout} s; connection closed"))
            ready(None)
            return

    def fail(self, err: VgpuError) -> None:
        """End the connection with err: every pending request gets it, and
        so does every later one."""
        with self._lock:
            if self._failed is not None:
                return
            self._failed = (type(err), str(err))
            pending, self._pending = self._pending, {}
            self._resuming = False
            self._gate.notify_all()
            sock = self.sock
        try:
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        for rid, req in pending.items():
            req[2].done(rid, None, self.error())

    def close(self) -> None:
        """Close the connection; pending requests fail with Unavailable."""
        self.fail(Unavailable(f"connection to mediator at {self.path} closed"))
        reader = self._reader
        if threading.current_thread() is not reader:
            reader.join()
        self.sock.close()

    def _read_loop(self, sock: _socket.socket) -> None:
        r = _Reader(sock)
        try:
            while True:
                self._read_one(r)
        except VgpuError as e:
            self.fail(e)
        except (OSError, EOFError) as e:
            self._lost(sock, Unavailable(f"connection to mediator at {self.path} lost: {e}"))
        except Exception as e:  # a bug here must not leave callers waiting forever
            self.fail(InternalError(f"reading replies from mediator at {self.path}: {e!r}"))

    def _lost(self, sock: _socket.socket, err: Unavailable) -> None:
        """The socket broke (the reader thread): resume the session on a
        new one if it can be, else fail with err."""
        with self._lock:
            if self._failed is not None or sock is not self.sock:
                return
            if not self._token or self._reconnect <= 0:
                resumable = False
            else:
                resumable, self._resuming = True, True
                pending, self._pending = self._pending, {}
        if not resumable:
            self.fail(Unavailable(f"{err}; the session cannot be resumed (the mediator gave no token, "
                                  "or reconnect is off)"))
            return
        try:  # not closed: a sender may be writing to it still
            sock.shutdown(_socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            failure = self._resume(pending)
        except Exception as e:  # a bug here must not leave callers waiting forever
            failure = self._give_up(pending, InternalError(f"resuming the session with mediator at {self.path}: {e!r}"))
        if failure is not None:
            self.fail(failure)

    def _resume(self, pending: dict[int, _Req]) -> VgpuError | None:
        """Dial again, resume the session, register the host regions again
        and send again, or interrupt, the requests of pending. Returns the
        failure that ends the session, if any; pending's entries are then
        back in the table, to get it."""
        deadline = time.monotonic() + self._reconnect
        pause = 0.02
        while self._failed is None:  # not closed meanwhile
            try:
                sock, _, _, token = _handshake(self.path, *self._hello, self._token, 10.0)
                break
            except Unavailable as e:
                failure: VgpuError = Unavailable(f"mediator at {self.path} not back within {self._reconnect} s: {e}")
                if time.monotonic() > deadline:
                    return self._give_up(pending, failure)
            except VgpuError as e:  # the mediator is back without the session
                return self._give_up(pending, type(e)(f"resuming the session: {e}"))
            time.sleep(pause)
            pause = min(2 * pause, 1.0)
        else:
            return self._give_up(pending, self.error())
        with self._lock:
            self.sock = sock
            if token:
                self._token = token
        self._start(sock)
        try:
            self._rehost()
        except VgpuError as e:
            return self._give_up(pending, Unavailable(f"registering host memory again with the resumed session: {e}"))
        unit_safe: dict[int, bool] = {}
        for op, _, entry, _ in pending.values():
            u = id(_unit(entry))
            unit_safe[u] = unit_safe.get(u, True) and op in SAFE_OPS
        for rid in sorted(pending):
            op, parts, entry, region = pending[rid]
            if unit_safe[id(_unit(entry))]:
                try:
                    self.send(op, parts, entry, region=region, resuming=True)
                except VgpuError:
                    pass  # the entry has the failure
            else:
                entry.done(rid, None, Interrupted(
                    f"{op.name.lower()}: interrupted by a lost connection to the mediator at {self.path}; "
                    "its outcome is unknown (the session was resumed)"))
        with self._lock:
            self._resuming = False
            self._gate.notify_all()
        return None

    def _give_up(self, pending: dict[int, _Req], failure: VgpuError) -> VgpuError:
        with self._lock:
            self._token = ""
            self._pending.update(pending)
        return failure

    def _read_one(self, r: _Reader) -> None:
        n, op, flags, rid = w.HEADER.unpack(r.exact(w.HEADER_SIZE))
        if n > w.MAX_BODY:
            raise ProtocolError(f"mediator at {self.path}: frame {rid} announces a {n}-byte body, limit {w.MAX_BODY}")
        if not flags & w.FLAG_REPLY:
            raise ProtocolError(f"mediator at {self.path} sent request {rid} (op {op}) where a reply was due")
        with self._lock:
            req = self._pending.pop(rid, None)
        if req is None:
            raise ProtocolError(f"mediator at {self.path} replied to unknown request {rid}")
        entry = req[2]
        if flags & w.FLAG_ERROR:
            entry.done(rid, None, w.decode_error(r.exact(n)))
        elif entry.into is None:
            entry.done(rid, r.exact(n), None)
        elif n != len(entry.into):
            r.skip(n)
            entry.done(rid, None, ProtocolError(f"mediator at {self.path} replied {n} bytes to op {op}, "
                                                f"want {len(entry.into)}"))
        else:
            r.into(entry.into)
            entry.done(rid, None, None)


def _unit(entry: object) -> object:
    """What entry's request is sent again with or interrupted with: its
    stream (in order, in flight together), or itself."""
    if isinstance(entry, _Into):
        return entry.stream
    return entry


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_MAP_FIXED = 0x10  # Linux; Python's mmap module does not name it


def _memfd(n: int) -> int:
    """A memfd of n bytes, sealed so that it can neither shrink nor grow:
    the mediator maps it and must never fault past its end."""
    fd = os.memfd_create("vgpu-host", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, n)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
    except OSError:
        os.close(fd)
        raise
    return fd


def _remap(r: _Region) -> int:
    """Move region r onto a new memfd, bytes and address kept, and return
    it: the mediator sealed the old one against a writable mapping
    (mediator/hostmem.go), so a resumed session cannot register it again."""
    fd = _memfd(r.size)
    try:
        with mmap.mmap(fd, r.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as tmp:
            view = np.frombuffer(tmp, dtype=np.uint8)
            view[:] = r.arr  # every page written: the mediator refuses holes
            del view
        p = _libc.mmap(r.base, r.size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | _MAP_FIXED, fd, 0)
        if p != r.base:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
    except OSError:
        os.close(fd)
        raise
    return fd


class _Region:
    """Host memory registered with the mediator: a memfd mapping."""

    __slots__ = ("id", "arr", "base", "size")

    def __init__(self, rid: int, arr: np.ndarray) -> None:
        self.id = rid
        self.arr = arr
        self.base = data_address(arr)
        self.size = arr.nbytes


class Client:
    """A session with the mediator on this host.

    socket: the mediator's Unix socket (default $VGPU_SOCKET, else
    /run/vgpu/mediator.sock); tenant: the tenant to act for (default
    $VGPU_TENANT; the mediator may decide otherwise); devices: virtual
    devices wanted (default $VGPU_DEVICES, else 1); timeout: seconds any
    wait for replies, or for the mediator to read a request, may take
    before the connection is given up as Unavailable (None: no bound);
    reconnect: seconds to try to resume the session when the connection
    breaks (the mediator restarted with its --state-dir), 0 never: the
    session then ends with the connection, its calls raising Unavailable.
    """

    def __init__(self, socket: str | None = None, tenant: str | None = None,
                 devices: int | None = None, timeout: float | None = None,
                 reconnect: float = DEFAULT_RECONNECT) -> None:
        path = socket or os.environ.get("VGPU_SOCKET") or DEFAULT_SOCKET
        if tenant is None:
            tenant = os.environ.get("VGPU_TENANT", "")
        if devices is None:
            env = os.environ.get("VGPU_DEVICES", "").strip()
            devices = _devices(env, "VGPU_DEVICES") if env else 0  # 0: the mediator's default, 1
        else:
            devices = _devices(devices, "devices")
        if timeout is not None and (not isinstance(timeout, numbers.Real) or not timeout > 0):
            raise InvalidArgument(f"timeout {timeout!r} is not a positive number of seconds")
        if isinstance(reconnect, bool) or not isinstance(reconnect, numbers.Real) or not reconnect >= 0:
            raise InvalidArgument(f"reconnect {reconnect!r} is not a number of seconds (0: never)")
        try:
            sock, self.session, self.devices, token = _handshake(path, tenant, devices,
                                                                 "" if reconnect > 0 else None, timeout)
        except Unavailable as e:
            if isinstance(e.__context__, TimeoutError):
                raise Unavailable(f"mediator at {path} did not answer hello within {timeout} s") from None
            raise
        self._regions: list[_Region] = []
        self._regions_lock = threading.Lock()
        me = weakref.ref(self)  # not the client itself: the connection must not keep it alive
        self._conn = _Conn(sock, path, timeout, (tenant, devices), token, float(reconnect),
                           lambda: me()._rehost())
        self.stream = Stream(self, 0)
        weakref.finalize(self, self._conn.close)

    @property
    def socket(self) -> str:
        """The mediator socket this session talks to."""
        return self._conn.path

    @property
    def requests(self) -> int:
        """Requests sent since the hello, each a frame that gets a reply."""
        return self._conn.requests

    @property
    def waits(self) -> int:
        """Times a caller blocked for replies: the round trips it paid for.
        Every call that waits for its reply counts one, and so does a
        synchronize with requests sent since the last one, whether or not
        their replies had come already."""
        return self._conn.waits

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the session; the mediator frees its device memory and host
        regions. Work not synchronized is abandoned."""
        self._conn.close()
        with self._regions_lock:
            self._regions = []

    def _rehost(self) -> None:
        """Register the host regions with a resumed session, which forgot
        them (the reader thread, while other requests wait)."""
        with self._regions_lock:
            regions = list(self._regions)
        for r in regions:
            try:
                fd = _remap(r)
            except OSError as e:
                raise _os_error(f"moving {r.size} bytes of host memory onto a new memfd", e) from None
            try:
                r.id = w.decode_u32(self._conn.call(w.Op.HOST_REGISTER, [w.encode_u64(r.size, "host allocation of")],
                                                    fd=fd, resuming=True))
            finally:
                os.close(fd)

    def _call(self, op: w.Op, parts: Sequence[object], into: memoryview | None = None,
              fd: int | None = None) -> bytes | bytearray | None:
        return self._conn.call(op, parts, into, fd)

    def malloc(self, size: int, device: int = 0, hint: w.Hint = w.Hint.NONE, near: int | None = None) -> int:
        """Allocate size bytes on virtual device ``device`` (or, with near,
        on the device of the allocation holding that address) and return
        its device address. The memory reads as zeros until written."""
        size = positive(size, "malloc size")
        try:
            hint = w.Hint(hint)
        except ValueError:
            raise InvalidArgument(f"malloc: {hint!r} is not a residency hint") from None
        flags, at = (0, 0) if near is None else (w.MALLOC_NEAR, address(near, "near address"))
        body = self._call(w.Op.MALLOC, [w.encode_malloc(device, size, hint, flags, at)])
        return w.decode_u64(body)

    def free(self, addr: int) -> None:
        """Free the allocation at addr once the work sent before is done."""
        self._call(w.Op.FREE, [w.encode_u64(address(addr, "free of"), "free of")])

    def seal(self, addr: int) -> None:
        """Make the allocation at addr immutable once the work sent before
        is done: later writes are refused (PermissionDenied), and a node
        that holds its contents already is not sent them again."""
        self._call(w.Op.SEAL, [w.encode_u64(address(addr, "seal of"), "seal of")])

    def kernels(self) -> list[w.KernelInfo]:
        """The kernel catalog."""
        return w.decode_kernel_list(self._call(w.Op.KERNELS, []))

    def stats(self) -> w.SessionStats:
        """What the session's work has cost so far, as the mediator counted it."""
        return w.decode_session_stats(self._call(w.Op.SESSION_STATS, []))

    def new_stream(self) -> Stream:
        """A stream that runs independently of the others."""
        return Stream(self, w.decode_u32(self._call(w.Op.STREAM_CREATE, [])))

    def register_graph(self, g: GraphDef) -> TensorGraph:
        """Register a tensor graph with the mediator, which checks it whole
        and refuses a bad one naming the op, tensor or value. It lives until
        release() or the session's end."""
        return TensorGraph._register(self, g)

    def host_alloc(self, n: int) -> np.ndarray:
        """n bytes of host memory shared with the mediator, like a GPU
        driver's pinned memory: copies from and to any part of it move
        through the shared mapping, not the socket. The pages are committed
        now (the mediator refuses memory with holes). Release it with
        host_free; the session's end releases it too."""
        n = positive(n, "host allocation of")
        try:
            fd = _memfd(n)
        except OSError as e:
            raise _os_error(f"host allocation of {n} bytes: memfd", e) from None
        try:
            mem = mmap.mmap(fd, n, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            arr = np.frombuffer(mem, dtype=np.uint8)
            arr[::mmap.PAGESIZE] = 0  # write every page, so none is a hole
            rid = w.decode_u32(self._call(w.Op.HOST_REGISTER, [w.encode_u64(n, "host allocation of")], fd=fd))
        except OSError as e:
            raise _os_error(f"host allocation of {n} bytes", e) from None
        finally:
            os.close(fd)
        with self._regions_lock:
            self._regions.append(_Region(rid, arr))
        return arr

    def host_free(self, arr: np.ndarray) -> None:
        """Unregister memory of host_alloc once the work sent before is
        done. Copies no longer use it; its mapping goes with the last
        array that refers to it."""
        view = byte_view(arr, False, "host free")
        with self._regions_lock:
            r = next((r for r in self._regions if r.base == data_address(view)), None)
            if r is not None:
                self._regions.remove(r)
        if r is None:
            raise InvalidArgument(f"host free of {view.nbytes} bytes: not memory of host_alloc")
        self._call(w.Op.HOST_UNREGISTER, [w.encode_u32(r.id, "host region")])

    def _region_of(self, view: np.ndarray) -> tuple[_Region, int] | None:
        """The registered region holding all of view, and view's offset in it."""
        p = data_address(view)
        with self._regions_lock:
            for r in self._regions:
                if r.base <= p and p + view.nbytes <= r.base + r.size:
                    return r, p - r.base
        return None


def _devices(v: object, what: str) -> int:
    """A count of virtual devices: an int, or the text of $VGPU_DEVICES."""
    try:
        n = int(v, 10) if isinstance(v, str) else integer(v, what)
    except ValueError:
        n = 0
    if n < 1:
        raise InvalidArgument(f"{what}={v!r}: want a positive whole number")
    return n


def _os_error(what: str, e: OSError) -> VgpuError:
    """A local system call's failure, typed: memory runs out as OutOfMemory."""
    if e.errno in (errno.ENOMEM, errno.ENOSPC):
        return OutOfMemory(f"{what}: {e}")
    return InternalError(f"{what}: {e}")


class _Into:
    """A stream's copy from the device whose reply body goes straight into
    the caller's buffer."""

    __slots__ = ("stream", "into")

    def __init__(self, stream: Stream, into: memoryview) -> None:
        self.stream = stream
        self.into = into

    def done(self, rid: int, body: object, error: VgpuError | None) -> None:
        self.stream.done(rid, body, error)


class Stream:
    """An in-order queue of device work. Its operations are sent at once
    and not waited for; synchronize waits for all of them."""

    into = None  # the replies of most operations are empty

    def __init__(self, client: Client, sid: int) -> None:
        self.client = client
        self.id = sid
        self._cond = threading.Condition(threading.Lock())
        self._outstanding = 0  # requests sent and not answered
        self._sent = False  # anything sent since the last synchronize
        self._error: tuple[int, VgpuError] | None = None  # the first failure, by request id

    def __repr__(self) -> str:
        return f"<vgpu.Stream {self.id} of session {self.client.session}>"

    def done(self, rid: int, body: object, error: VgpuError | None) -> None:
        """A reply to one of the stream's requests (the reader's thread)."""
        with self._cond:
            if error is not None and (self._error is None or rid < self._error[0]):
                self._error = (rid, error)
            self._outstanding -= 1
            if self._outstanding == 0:
                self._cond.notify_all()

    def _send(self, op: w.Op, parts: Sequence[object], entry: object = None, region: _Region | None = None) -> None:
        with self._cond:
            self._outstanding += 1
            self._sent = True
        self.client._conn.send(op, parts, entry or self, region=region)

    def copy_to_device(self, dst: int, data: object) -> None:
        """Copy data (bytes-like or a C-contiguous numpy array) to device
        address dst. From memory of host_alloc the bytes move through the
        shared mapping, and must stay unchanged until synchronize returns;
        other bytes are on the socket, in frames of at most 1 MiB, when
        this returns."""
        dst = address(dst, "copy destination")
        src = byte_view(data, False, "copy source")
        n = src.nbytes
        if n == 0:
            raise InvalidArgument(f"copy of 0 bytes to {dst:#x}")
        region = self.client._region_of(src)
        if region is not None:
            self._send(w.Op.COPY_TO_DEVICE_HOST, [w.encode_copy_host(self.id, dst, 0, region[1], n)],
                       region=region[0])
            return
        for off in range(0, n, w.MAX_CHUNK):
            self._send(w.Op.COPY_TO_DEVICE, [w.encode_copy_to_device(self.id, dst + off), src[off:off + w.MAX_CHUNK]])

    def copy_from_device(self, src: int, out: object) -> None:
        """Copy len(out) bytes at device address src into out (a writable
        numpy array, bytearray or memoryview), which holds them once
        synchronize returns."""
        src = address(src, "copy source")
        dst = byte_view(out, True, "copy destination")
        n = dst.nbytes
        if n == 0:
            raise InvalidArgument(f"copy of 0 bytes from {src:#x}")
        region = self.client._region_of(dst)
        if region is not None:
            self._send(w.Op.COPY_FROM_DEVICE_HOST, [w.encode_copy_host(self.id, src, 0, region[1], n)],
                       region=region[0])
            return
        for off in range(0, n, w.MAX_CHUNK):
            part = dst[off:off + w.MAX_CHUNK]
            self._send(w.Op.COPY_FROM_DEVICE, [w.encode_copy_from_device(self.id, src + off, part.nbytes)],
                       _Into(self, memoryview(part)))

    def memset(self, dst: int, value: int, n: int) -> None:
        """Set n bytes at device address dst to value."""
        self._send(w.Op.MEMSET, [w.encode_memset(self.id, address(dst, "memset at"), value, positive(n, "memset of"))])

    def copy_device(self, dst: int, src: int, n: int) -> None:
        """Copy n bytes from device address src to dst."""
        self._send(w.Op.COPY_DEVICE, [w.encode_copy_device(self.id, address(dst, "copy destination"),
                                                           address(src, "copy source"), positive(n, "copy of"))])

    def launch(self, kernel: str, *args: object) -> None:
        """Launch kernel with args in the order of its parameters: a
        vgpu.Ptr for a buffer, an int (or vgpu.I64) for an i64, a float (or
        vgpu.F32) for an f32."""
        packed = [_kernel_arg(kernel, i, a) for i, a in enumerate(args)]
        self._send(w.Op.LAUNCH, [w.encode_launch(self.id, kernel, packed)])

    def synchronize(self) -> None:
        """Wait for everything sent on the stream; raise the first error any
        of it met since the last synchronize (or the connection's failure)."""
        with self._cond:
            sent, self._sent = self._sent, False
        if sent:
            def idle(timeout: float | None) -> bool:
                with self._cond:
                    return self._cond.wait_for(lambda: self._outstanding == 0, timeout)
            self.client._conn.wait(idle, "synchronize")
        with self._cond:
            failed, self._error = self._error, None
        if failed is not None:
            raise failed[1]
        err = self.client._conn.error()
        if err is not None:
            raise err

    def destroy(self) -> None:
        """Synchronize and remove the stream."""
        if self.id == 0:
            raise InvalidArgument("the default stream cannot be destroyed")
        self.synchronize()
        self.client._call(w.Op.STREAM_DESTROY, [w.encode_u32(self.id, "stream")])
