"""The vgpu wire protocol, as the Go package api defines it.

Everything here mirrors a Go declaration, named in each docstring, and
must change with it: the frame header (api/wire/frame.go), field encoding
(api/wire/codec.go), operation numbers (api/ops.go) and message layouts
(api/hello.go, api/messages.go, the tenant's wire in api/tenant*.go,
api/tensor.go), hints (api/vocab/hint.go). The client builds
requests with these encoders and reads replies with the Decoder; nothing
here does I/O.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, fields
from typing import Sequence

from .errors import InvalidArgument, ProtocolError, VgpuError, error_for

# api/wire/frame.go
HEADER = struct.Struct("<IHHQ")  # body length, op, flags, request id
HEADER_SIZE = HEADER.size
MAX_CHUNK = 1 << 20
MAX_BODY = MAX_CHUNK + (64 << 10)
FLAG_REPLY = 1
FLAG_ERROR = 2

# api/wire/codec.go
MAX_STRING = 4096
MAX_LIST = 1 << 16

# api/hello.go: Hello
MAGIC = 0x55504756
VERSION = 6
ROLE_TENANT = 1

# api/tensor.go limits, checked here because the mediator's decoder refuses
# graphs past them as protocol errors rather than naming the value.
MAX_TENSOR_DIMS = 4
MAX_GRAPH_TENSORS = 1 << 12
MAX_GRAPH_OPS = 1 << 12
MAX_GRAPH_SCALARS = 16


class Op(enum.IntEnum):
    """Operation numbers a tenant uses (api/ops.go)."""

    HELLO = 1
    KERNELS = 2
    MALLOC = 16
    FREE = 17
    STREAM_CREATE = 18
    STREAM_DESTROY = 19
    COPY_TO_DEVICE = 20
    COPY_FROM_DEVICE = 21
    COPY_DEVICE = 22
    MEMSET = 23
    LAUNCH = 24
    HOST_REGISTER = 32
    HOST_UNREGISTER = 33
    COPY_TO_DEVICE_HOST = 34
    COPY_FROM_DEVICE_HOST = 35
    SEAL = 37
    SESSION_STATS = 41
    GRAPH_REGISTER = 96
    GRAPH_INVOKE = 97
    GRAPH_RELEASE = 98


class Hint(enum.IntEnum):
    """What a buffer is for, given at allocation (api/vocab/hint.go)."""

    NONE = 0
    WEIGHT = 1  # persistent, read-mostly; evicted last, deduplicated once sealed
    ACTIVATION = 2  # ephemeral; evicted first
    KV_CACHE = 3  # stateful; placed next to the buffer named by ``near``
    STAGING = 4  # a bounce buffer for host data; evicted first


class DType(enum.IntEnum):
    """A tensor's element type (api/tensor.go); both are 4 bytes, little-endian."""

    F32 = 1
    I32 = 2

    @property
    def numpy(self) -> str:
        """The numpy dtype string of the element type."""
        return "<f4" if self is DType.F32 else "<i4"

    @property
    def size(self) -> int:
        """Bytes of one element."""
        return 4


class Residency(enum.IntEnum):
    """What a graph tensor is for, and so where it lives (api/tensor.go)."""

    WEIGHT = 1
    ACTIVATION = 2
    KV_CACHE = 3
    INPUT = 4
    OUTPUT = 5


class Phase(enum.IntEnum):
    """The part of a model's work a graph operation belongs to (api/tensor.go)."""

    OTHER = 0
    PREFILL = 1
    DECODE = 2
    FORWARD = 3
    BACKWARD = 4


class ArgKind(enum.IntEnum):
    """The kind of a kernel argument or parameter (api/messages.go)."""

    BUFFER = 1
    I64 = 2
    F32 = 3


class Access(enum.IntEnum):
    """How a kernel uses a buffer parameter (api/messages.go)."""

    NONE = 0
    READ = 1
    WRITE = 2
    READ_WRITE = 3


class OpArgKind(enum.IntEnum):
    """The kind of a graph operation's argument (api/tenant_graph.go)."""

    TENSOR = 1
    I64 = 2
    F32 = 3
    SCALAR = 4


@dataclass(frozen=True)
class DeviceInfo:
    """A virtual device of the session (api.DeviceInfo); memory in bytes."""

    index: int
    name: str
    node: str
    memory: int


@dataclass(frozen=True)
class Param:
    """A kernel parameter (api.Param). A buffer parameter touches ``elem``
    times the product of the i64 parameters named in ``dims`` bytes, and
    takes elements of ``dtype`` (0 on the wire reads as F32, as the
    mediator's graph check does); ``dtype`` is None for scalars."""

    name: str
    kind: ArgKind
    access: Access
    elem: int
    dims: tuple[str, ...]
    dtype: DType | None


@dataclass(frozen=True)
class KernelInfo:
    """A kernel of the catalog (api.KernelInfo)."""

    name: str
    doc: str
    params: list[Param]


@dataclass(frozen=True)
class SessionStats:
    """What the session's work has cost, as the mediator counted it
    (api.SessionStats). ``socket_in``/``socket_out`` are the bytes of
    frames on the tenant's own socket: copies through host_alloc memory do
    not count there."""

    copied_in: int
    copied_out: int
    launches: int
    net_out: int
    net_in: int
    dedup_hits: int
    dedup_bytes: int
    socket_in: int
    socket_out: int
    shared_hits: int
    shared_misses: int


_U8, _U16, _U32, _U64, _I64, _F32 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q", "<q", "<f"))


class Encoder:
    """Appends little-endian fields (wire.Encoder). A value out of its
    field's range raises InvalidArgument naming it as ``what``."""

    __slots__ = ("b",)

    def __init__(self) -> None:
        self.b = bytearray()

    def _put(self, s: struct.Struct, v: object, what: str) -> None:
        try:
            self.b += s.pack(v)
        except (struct.error, OverflowError, TypeError) as e:
            raise InvalidArgument(f"{what} {v!r} does not fit the wire's {s.format[1:]} field: {e}") from None

    def u8(self, v: int, what: str = "value") -> None:
        self._put(_U8, v, what)

    def u16(self, v: int, what: str = "value") -> None:
        self._put(_U16, v, what)

    def u32(self, v: int, what: str = "value") -> None:
        self._put(_U32, v, what)

    def u64(self, v: int, what: str = "value") -> None:
        self._put(_U64, v, what)

    def i64(self, v: int, what: str = "value") -> None:
        self._put(_I64, v, what)

    def f32(self, v: float, what: str = "value") -> None:
        self._put(_F32, v, what)

    def string(self, s: str, what: str = "string") -> None:
        if not isinstance(s, str):
            raise InvalidArgument(f"{what} {s!r} is not a str")
        raw = s.encode()
        if len(raw) > MAX_STRING:
            raise InvalidArgument(f"{what} of {len(raw)} bytes exceeds the limit of {MAX_STRING}")
        self.u32(len(raw))
        self.b += raw

    def count(self, n: int, what: str) -> None:
        """A list's length, bounded as the decoder bounds it."""
        if n > MAX_LIST:
            raise InvalidArgument(f"{what}: {n} elements exceed the limit of {MAX_LIST}")
        self.u32(n)


class Decoder:
    """Reads fields written by an Encoder from a reply body (wire.Decoder);
    a short or malformed body raises ProtocolError."""

    __slots__ = ("b", "off")

    def __init__(self, b: bytes | bytearray | memoryview) -> None:
        self.b = b
        self.off = 0

    def _get(self, s: struct.Struct) -> int:
        if len(self.b) - self.off < s.size:
            raise ProtocolError(f"decode: need {s.size} bytes at offset {self.off}, have {len(self.b) - self.off}")
        (v,) = s.unpack_from(self.b, self.off)
        self.off += s.size
        return v

    def u8(self) -> int:
        return self._get(_U8)

    def u16(self) -> int:
        return self._get(_U16)

    def u32(self) -> int:
        return self._get(_U32)

    def u64(self) -> int:
        return self._get(_U64)

    def string(self) -> str:
        n = self.u32()
        if n > MAX_STRING or len(self.b) - self.off < n:
            raise ProtocolError(f"decode: string of {n} bytes at offset {self.off}, {len(self.b) - self.off} left")
        s = bytes(self.b[self.off:self.off + n]).decode(errors="replace")
        self.off += n
        return s

    def finish(self) -> None:
        if self.off != len(self.b):
            raise ProtocolError(f"decode: {len(self.b) - self.off} trailing bytes")


def decode_error(body: bytes) -> VgpuError:
    """The exception an error reply carries (wire.DecodeError)."""
    try:
        d = Decoder(body)
        code, msg = d.u16(), d.string()
        d.finish()
    except ProtocolError as e:
        return ProtocolError(f"malformed error reply: {e}")
    return error_for(code, msg)


def decode_u32(body: bytes) -> int:
    """A reply of one u32: StreamReply, HostRegion, Graph."""
    d = Decoder(body)
    v = d.u32()
    d.finish()
    return v


def decode_u64(body: bytes) -> int:
    """A reply of one u64: MallocReply."""
    d = Decoder(body)
    v = d.u64()
    d.finish()
    return v


MAX_TOKEN = 64  # api.MaxToken


def encode_hello(tenant: str, devices: int, resume: str | None = None) -> bytearray:
    """api.Hello of a tenant; weight and compute cap are the mediator's.
    With resume (Resumable), the optional trailing field: "" asks for a
    session token, a token takes up that session again."""
    e = Encoder()
    e.u32(MAGIC)
    e.u16(VERSION)
    e.u8(ROLE_TENANT)
    e.string(tenant, "tenant")
    e.u32(devices, "devices")
    e.u32(0)
    e.f32(0.0)
    if resume is not None:
        e.string(resume, "session token")
    return e.b


def decode_hello_reply(body: bytes) -> tuple[int, list[DeviceInfo], str]:
    """api.HelloReply: the session id, its devices and its token (the
    optional trailing field; "" where absent or the mediator keeps none)."""
    d = Decoder(body)
    version = d.u16()
    if version != VERSION:
        raise ProtocolError(f"mediator speaks protocol version {version}, this client {VERSION}")
    session = d.u64()
    devices = [DeviceInfo(d.u32(), d.string(), d.string(), d.u64()) for _ in range(d.u32())]
    token = d.string() if d.off < len(d.b) else ""
    if len(token) > MAX_TOKEN:
        raise ProtocolError(f"decode: session token of {len(token)} bytes, limit {MAX_TOKEN}")
    d.finish()
    return session, devices, token


MALLOC_NEAR = 2  # api.MallocNear


def encode_malloc(device: int, size: int, hint: int, flags: int, near: int) -> bytearray:
    """api.Malloc (the stream of MallocFreeWithStream unused: flags never carry it)."""
    e = Encoder()
    e.u32(device, "device")
    e.u64(size, "size")
    e.u8(hint, "hint")
    e.u8(flags)
    e.u32(0)
    e.u64(near, "near address")
    return e.b


def encode_u32(v: int, what: str) -> bytearray:
    """A request of one u32: StreamReq, HostRegion, Graph."""
    e = Encoder()
    e.u32(v, what)
    return e.b


def encode_u64(v: int, what: str) -> bytearray:
    """A request of one u64: Free, Seal, HostRegister."""
    e = Encoder()
    e.u64(v, what)
    return e.b


def encode_copy_to_device(stream: int, dst: int) -> bytearray:
    """The fields of api.CopyToDevice in front of its payload."""
    e = Encoder()
    e.u32(stream)
    e.u64(dst, "destination address")
    return e.b


def encode_copy_from_device(stream: int, src: int, n: int) -> bytearray:
    """api.CopyFromDevice; the reply body is the bytes."""
    e = Encoder()
    e.u32(stream)
    e.u64(src, "source address")
    e.u64(n, "length")
    return e.b


def encode_copy_device(stream: int, dst: int, src: int, n: int) -> bytearray:
    """api.CopyDevice."""
    e = Encoder()
    e.u32(stream)
    e.u64(dst, "destination address")
    e.u64(src, "source address")
    e.u64(n, "length")
    return e.b


def encode_memset(stream: int, dst: int, value: int, n: int) -> bytearray:
    """api.Memset."""
    e = Encoder()
    e.u32(stream)
    e.u64(dst, "destination address")
    e.u8(value, "memset value")
    e.u64(n, "length")
    return e.b


def encode_copy_host(stream: int, addr: int, region: int, off: int, n: int) -> bytearray:
    """api.CopyHost, for OpCopyToDeviceHost and OpCopyFromDeviceHost."""
    e = Encoder()
    e.u32(stream)
    e.u64(addr, "device address")
    e.u32(region)
    e.u64(off)
    e.u64(n, "length")
    return e.b


def encode_launch(stream: int, kernel: str, args: Sequence[tuple[int, int]]) -> bytearray:
    """api.Launch; each argument is its kind and its 64 bits."""
    e = Encoder()
    e.u32(stream)
    e.string(kernel, "kernel name")
    e.count(len(args), f"launch of {kernel}")
    for kind, bits in args:
        e.b += _U8.pack(kind) + _U64.pack(bits)
    return e.b


def _known(cls: type[enum.IntEnum], v: int, what: str) -> enum.IntEnum:
    """v as a member of cls; a value this client does not know breaks the protocol."""
    try:
        return cls(v)
    except ValueError:
        raise ProtocolError(f"decode: {what} {v} is not a known {cls.__name__}") from None


def decode_kernel_list(body: bytes) -> list[KernelInfo]:
    """api.KernelList."""
    d = Decoder(body)
    kernels = []
    for _ in range(d.u32()):
        name, doc = d.string(), d.string()
        params = []
        for _ in range(d.u32()):
            what = f"kernel {name} parameter {len(params)}"
            pname, kind, access, elem = d.string(), _known(ArgKind, d.u8(), what), _known(Access, d.u8(), what), d.u8()
            dims = tuple(d.string() for _ in range(d.u32()))
            dtype = _known(DType, d.u8() or DType.F32, what)  # 0 on the wire: f32
            params.append(Param(pname, kind, access, elem, dims, dtype if kind == ArgKind.BUFFER else None))
        kernels.append(KernelInfo(name, doc, params))
    d.finish()
    return kernels


def decode_session_stats(body: bytes) -> SessionStats:
    """api.SessionStats: eleven u64 counters in field order."""
    d = Decoder(body)
    st = SessionStats(*(d.u64() for _ in fields(SessionStats)))
    d.finish()
    return st


@dataclass(frozen=True)
class TensorDef:
    """api.TensorDef."""

    name: str
    dtype: DType
    residency: Residency
    addr: int
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.size


def encode_graph_def(name: str, scalars: Sequence[str], tensors: Sequence[TensorDef],
                     ops: Sequence[tuple[str, Phase, Sequence[tuple]]]) -> bytearray:
    """api.GraphDef. An operation is (kernel, phase, args); an argument is
    (OpArgKind.TENSOR, index), (I64, value), (F32, value) or
    (SCALAR, index, mul, add)."""
    e = Encoder()
    e.string(name, "graph name")
    e.count(len(scalars), "scalars")
    for s in scalars:
        e.string(s, "scalar name")
    e.count(len(tensors), "tensors")
    for t in tensors:
        e.string(t.name, "tensor name")
        e.u8(t.dtype)
        e.u8(t.residency)
        e.u64(t.addr, f"address of tensor {t.name!r}")
        e.count(len(t.shape), "shape")
        for dim in t.shape:
            e.i64(dim, f"dimension of tensor {t.name!r}")
    e.count(len(ops), "ops")
    for j, (kernel, phase, args) in enumerate(ops):
        e.string(kernel, "kernel name")
        e.u8(phase)
        e.count(len(args), f"op {j} ({kernel}) arguments")
        for i, a in enumerate(args):
            what = f"op {j} ({kernel}) argument {i}"
            e.u8(a[0])
            if a[0] == OpArgKind.TENSOR:
                e.u32(a[1], what)
            elif a[0] == OpArgKind.F32:
                e.f32(a[1], what)
            elif a[0] == OpArgKind.SCALAR:
                e.u32(a[1], what)
                e.i64(a[2], what + " multiplier")
                e.i64(a[3], what + " addend")
            else:
                e.i64(a[1], what)
    return e.b


def encode_graph_invoke(graph: int, scalars: Sequence[int]) -> bytearray:
    """The fields of api.GraphInvoke in front of its input bytes."""
    e = Encoder()
    e.u32(graph)
    e.count(len(scalars), "scalars")
    for i, s in enumerate(scalars):
        e.i64(s, f"scalar {i}")
    return e.b
