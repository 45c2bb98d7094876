"""Tensor graphs (docs/graphs.md): a model's work described once, with
its meaning, registered with the mediator and invoked in one round trip.

A GraphDef declares scalar inputs, tensors (weights and KV caches bound to
allocations of the session; inputs, outputs and activations in the
graph's own arena) and operations, each a catalog kernel with arguments in
the order of its parameters. Client.register_graph sends it; the mediator
checks it whole and refuses a bad graph naming the op, tensor or value.
The builder itself checks only what the wire cannot carry (the decoder
would refuse it as a protocol error rather than name it) and what the
client relies on: the shapes it sizes inputs and outputs by.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from . import _wire as w
from ._values import address, byte_view, integer
from .errors import InvalidArgument, ProtocolError

if TYPE_CHECKING:
    from .client import Client


class Tensor(int):
    """A tensor of a GraphDef: its index among the graph's tensors (what
    the wire names it by), with what was declared of it."""

    graph: GraphDef
    name: str
    dtype: w.DType
    shape: tuple[int, ...]
    residency: w.Residency

    def __new__(cls, index: int, graph: GraphDef, d: w.TensorDef) -> Tensor:
        t = super().__new__(cls, index)
        t.graph, t.name, t.dtype, t.shape, t.residency = graph, d.name, d.dtype, d.shape, d.residency
        return t

    @property
    def nbytes(self) -> int:
        return self.graph.tensors[self].nbytes

    def __repr__(self) -> str:
        return f"Tensor({int(self)}, {self.name!r}, {self.dtype.name}, {list(self.shape)}, {self.residency.name})"


@dataclass(frozen=True)
class ScalarExpr:
    """mul × (scalar input number ``scalar``) + add, for an i64 parameter:
    what ``pos * 2 + 1`` builds from a Scalar."""

    scalar: int
    mul: int = 1
    add: int = 0

    def __mul__(self, k: int) -> ScalarExpr:
        k = integer(k, f"scalar {self.scalar} times")
        return ScalarExpr(self.scalar, self.mul * k, self.add * k)

    __rmul__ = __mul__

    def __add__(self, k: int) -> ScalarExpr:
        return ScalarExpr(self.scalar, self.mul, self.add + integer(k, f"scalar {self.scalar} plus"))

    __radd__ = __add__

    def __sub__(self, k: int) -> ScalarExpr:
        return ScalarExpr(self.scalar, self.mul, self.add - integer(k, f"scalar {self.scalar} minus"))


@dataclass(frozen=True)
class Scalar(ScalarExpr):
    """A scalar input of a graph, which each invocation supplies (a decode
    position, say)."""

    name: str = ""


class GraphDef:
    """Builds a tensor graph called name. Operations run in the order they
    are added. Not safe for concurrent use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scalars: list[str] = []
        self.tensors: list[w.TensorDef] = []
        self.ops: list[tuple[str, w.Phase, list[tuple]]] = []

    def scalar(self, name: str) -> Scalar:
        """Declare the next scalar input of every invocation."""
        if len(self.scalars) == w.MAX_GRAPH_SCALARS:
            raise InvalidArgument(f"graph {self.name!r}: scalar {name!r} would be one past the limit of {w.MAX_GRAPH_SCALARS}")
        self.scalars.append(name)
        return Scalar(len(self.scalars) - 1, name=name)

    def weight(self, name: str, dtype: w.DType, addr: int, shape: Sequence[int]) -> Tensor:
        """A read-only tensor at addr, anywhere in a sealed allocation that
        holds all of it (one allocation may hold a model's weights)."""
        return self._tensor(name, dtype, w.Residency.WEIGHT, addr, shape)

    def kv_cache(self, name: str, dtype: w.DType, addr: int, shape: Sequence[int]) -> Tensor:
        """A tensor kept across invocations at addr, in an allocation that
        holds all of it (allocated with Hint.KV_CACHE, say)."""
        return self._tensor(name, dtype, w.Residency.KV_CACHE, addr, shape)

    def input(self, name: str, dtype: w.DType, shape: Sequence[int]) -> Tensor:
        """A tensor written from each invocation's input bytes."""
        return self._tensor(name, dtype, w.Residency.INPUT, None, shape)

    def output(self, name: str, dtype: w.DType, shape: Sequence[int]) -> Tensor:
        """A tensor returned by each invocation."""
        return self._tensor(name, dtype, w.Residency.OUTPUT, None, shape)

    def activation(self, name: str, dtype: w.DType, shape: Sequence[int]) -> Tensor:
        """An intermediate tensor, in the graph's arena."""
        return self._tensor(name, dtype, w.Residency.ACTIVATION, None, shape)

    def _tensor(self, name: str, dtype: w.DType, residency: w.Residency, addr: int | None,
                shape: Sequence[int] | int) -> Tensor:
        what = f"graph {self.name!r}: tensor {len(self.tensors)} ({name}, {residency.name.lower()})"
        if len(self.tensors) == w.MAX_GRAPH_TENSORS:
            raise InvalidArgument(f"{what}: one past the limit of {w.MAX_GRAPH_TENSORS} tensors")
        try:
            dtype = w.DType(dtype)
        except ValueError:
            raise InvalidArgument(f"{what}: {dtype!r} is not an element type (vgpu.DType)") from None
        dims = (shape,) if isinstance(shape, numbers.Integral) else tuple(shape)
        if not 1 <= len(dims) <= w.MAX_TENSOR_DIMS:
            raise InvalidArgument(f"{what}: shape {list(dims)} has {len(dims)} dimensions, want 1 to {w.MAX_TENSOR_DIMS}")
        dims = tuple(integer(d, f"{what}: shape {list(dims)}") for d in dims)
        if min(dims) < 1:
            raise InvalidArgument(f"{what}: shape {list(dims)} has a dimension below 1")
        at = 0
        if addr is not None:
            at = address(addr, f"{what}: address")
            if at == 0:
                raise InvalidArgument(f"{what}: no allocation given (address 0)")
        d = w.TensorDef(name, dtype, residency, at, dims)
        self.tensors.append(d)
        return Tensor(len(self.tensors) - 1, self, d)

    def op(self, phase: w.Phase, kernel: str, *args: object) -> None:
        """Append an operation: kernel run with args in the order of its
        parameters (a Tensor for a buffer; an int or a Scalar expression
        for an i64; a float for an f32), as part of phase."""
        what = f"graph {self.name!r}: op {len(self.ops)} ({kernel})"
        if len(self.ops) == w.MAX_GRAPH_OPS:
            raise InvalidArgument(f"{what}: one past the limit of {w.MAX_GRAPH_OPS} operations")
        try:
            phase = w.Phase(phase)
        except ValueError:
            raise InvalidArgument(f"{what}: {phase!r} is not a phase (vgpu.Phase)") from None
        self.ops.append((kernel, phase, [self._op_arg(f"{what} argument {i}", a) for i, a in enumerate(args)]))

    def _op_arg(self, what: str, a: object) -> tuple:
        if isinstance(a, Tensor):
            if a.graph is not self:
                raise InvalidArgument(f"{what}: {a!r} is a tensor of graph {a.graph.name!r}")
            return (w.OpArgKind.TENSOR, int(a))
        if isinstance(a, ScalarExpr):
            return (w.OpArgKind.SCALAR, a.scalar, a.mul, a.add)
        if isinstance(a, numbers.Integral) and not isinstance(a, bool):
            return (w.OpArgKind.I64, int(a))
        if isinstance(a, numbers.Real) and not isinstance(a, bool):
            return (w.OpArgKind.F32, float(a))
        raise InvalidArgument(f"{what}: {a!r} ({type(a).__name__}) is not a Tensor, an int, a float or a Scalar expression")

    def _encode(self) -> bytearray:
        body = w.encode_graph_def(self.name, self.scalars, self.tensors, self.ops)
        if len(body) > w.MAX_BODY:
            raise InvalidArgument(f"graph {self.name!r} takes {len(body)} bytes on the wire, limit {w.MAX_BODY}")
        return body


class TensorInfo(NamedTuple):
    """An input or output of a registered graph; index is its tensor's."""

    name: str
    dtype: w.DType
    shape: tuple[int, ...]
    nbytes: int
    index: int


class TensorGraph:
    """A graph registered with the mediator."""

    def __init__(self, client: Client, gid: int, g: GraphDef) -> None:
        self.client = client
        self.id = gid
        self.name = g.name
        self.scalars = tuple(g.scalars)
        ios = [TensorInfo(t.name, t.dtype, t.shape, t.nbytes, i)
               for i, t in enumerate(g.tensors)]
        self.inputs = tuple(io for io, t in zip(ios, g.tensors) if t.residency == w.Residency.INPUT)
        self.outputs = tuple(io for io, t in zip(ios, g.tensors) if t.residency == w.Residency.OUTPUT)

    @classmethod
    def _register(cls, client: Client, g: GraphDef) -> TensorGraph:
        return cls(client, w.decode_u32(client._call(w.Op.GRAPH_REGISTER, [g._encode()])), g)

    def __repr__(self) -> str:
        return f"<vgpu.TensorGraph {self.id} {self.name!r}>"

    def invoke(self, scalars: Sequence[int], *inputs: object) -> list[np.ndarray]:
        """Run the graph with one value per declared scalar and one array
        (or bytes-like) per input tensor, in declaration order, each exactly
        the tensor's bytes; an array must be of the tensor's element type
        or raw uint8. Returns the outputs as arrays of their shapes and
        element types. One request, one wait."""
        scalars = list(scalars)
        if len(scalars) != len(self.scalars):
            raise InvalidArgument(f"graph {self.name!r} takes {len(self.scalars)} scalars {list(self.scalars)}, got {len(scalars)}")
        if len(inputs) != len(self.inputs):
            raise InvalidArgument(f"graph {self.name!r} takes {len(self.inputs)} inputs, got {len(inputs)}")
        parts: list[object] = [w.encode_graph_invoke(self.id, [integer(s, f"graph {self.name!r}: scalar") for s in scalars])]
        for info, x in zip(self.inputs, inputs):
            what = f"graph {self.name!r}: input tensor {info.index} ({info.name})"
            if isinstance(x, np.ndarray) and x.dtype not in (np.dtype(info.dtype.numpy), np.dtype(np.uint8)):
                raise InvalidArgument(f"{what} is {info.dtype.name.lower()}, got an array of {x.dtype}")
            view = byte_view(x, False, what)
            if view.nbytes != info.nbytes:
                raise InvalidArgument(f"{what} holds {info.nbytes} bytes, got {view.nbytes}")
            parts.append(view)
        total = sum(o.nbytes for o in self.outputs)
        out = np.empty(total, dtype=np.uint8)
        body = self.client._call(w.Op.GRAPH_INVOKE, parts, into=memoryview(out) if total else None)
        if not total and body:
            raise ProtocolError(f"graph {self.name!r}: {len(body)} bytes of outputs, want none")
        results, off = [], 0
        for o in self.outputs:
            results.append(out[off:off + o.nbytes].view(o.dtype.numpy).reshape(o.shape))
            off += o.nbytes
        return results

    def release(self) -> None:
        """Drop the graph once the work sent before is done; the allocations
        it bound may then be freed."""
        self.client._call(w.Op.GRAPH_RELEASE, [w.encode_u32(self.id, "graph")])
