"""vgpu: a plain-Python client of the vgpu wire protocol.

This package owns the tenant's side of the protocol in Python, with numpy
for host buffers and nothing else: the framing and messages (mirroring the
Go package api), a session with the mediator (Client) with its device
memory, host memory shared with the mediator (host_alloc, for zero-copy
copies), pipelined streams, the kernel catalog and session statistics;
the tensor-graph builder and registered graphs (GraphDef, TensorGraph);
and one exception class per wire error code. vgpu.torch, a PyTorch front
end, is built on this API and lives in its own subpackage.

    import vgpu
    with vgpu.Client() as c:
        x = c.malloc(4096, hint=vgpu.Hint.ACTIVATION)
        c.stream.copy_to_device(x, data)
        c.stream.launch("saxpy", 1024, 2.0, vgpu.Ptr(x), vgpu.Ptr(y))
        c.stream.synchronize()
"""

from ._wire import (MAX_CHUNK, Access, ArgKind, DeviceInfo, DType, Hint, KernelInfo, Param, Phase,
                    Residency, SessionStats)
from .client import DEFAULT_SOCKET, F32, I64, Client, Ptr, Stream
from .errors import (InternalError, Interrupted, InvalidAddress, InvalidArgument, OutOfMemory, PermissionDenied,
                     ProtocolError, QuotaExceeded, Unavailable, UnknownKernel, VgpuError)
from .graph import GraphDef, Scalar, ScalarExpr, Tensor, TensorGraph, TensorInfo

__all__ = [
    "MAX_CHUNK", "DEFAULT_SOCKET",
    "Client", "Stream", "Ptr", "I64", "F32",
    "DeviceInfo", "KernelInfo", "Param", "SessionStats",
    "Hint", "DType", "Phase", "Residency", "ArgKind", "Access",
    "GraphDef", "Scalar", "ScalarExpr", "Tensor", "TensorGraph", "TensorInfo",
    "VgpuError", "OutOfMemory", "QuotaExceeded", "InvalidAddress", "InvalidArgument", "UnknownKernel",
    "PermissionDenied", "Unavailable", "Interrupted", "ProtocolError", "InternalError",
]
