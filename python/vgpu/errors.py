"""Typed errors of the vgpu protocol.

Every failure the mediator reports crosses the wire as a code and a message
that names the offending value (DESIGN.md, "Error contract"). Each code has
one exception class here, so a caller catches the class of failure it can
handle (``except vgpu.OutOfMemory``) and shows the mediator's message as is
(``str(e)``). The client raises the same classes for what it refuses itself
before sending (InvalidArgument) and for a mediator it cannot reach or has
lost (Unavailable).
"""

from __future__ import annotations


class VgpuError(Exception):
    """A failure of a vgpu request; ``code`` is its wire code (api/vocab/errors.go)."""

    code = 0

    def __init__(self, message: str) -> None:
        super().__init__(message)


class OutOfMemory(VgpuError):
    """The device (or host memory backing it) has no room."""

    code = 1


class QuotaExceeded(VgpuError):
    """The tenant's quota (memory, graphs, regions) does not allow it."""

    code = 2


class InvalidAddress(VgpuError):
    """A device address lies in no allocation of the session."""

    code = 3


class InvalidArgument(VgpuError):
    """A value of the request is refused; the message names it."""

    code = 4


class UnknownKernel(VgpuError):
    """The kernel named is not in the catalog."""

    code = 5


class PermissionDenied(VgpuError):
    """The session may not do this (a write to sealed memory, say)."""

    code = 6


class Unavailable(VgpuError):
    """The mediator, or a node behind it, cannot be reached or was lost."""

    code = 7


class Interrupted(Unavailable):
    """The connection to the mediator broke while this call was in flight,
    and it is not safe to send again: the mediator may or may not have
    applied it before it died. The client reconnected and resumed the
    session, which goes on with its device memory intact; what the call
    could have written is unspecified (either outcome). docs/architecture.md
    ("Sessions and their device memory") lists which calls are sent again
    and which raise this."""


class ProtocolError(VgpuError):
    """A peer broke the wire protocol."""

    code = 8


class InternalError(VgpuError):
    """A failure of the mediator or node itself."""

    code = 9


_BY_CODE: dict[int, type[VgpuError]] = {
    cls.code: cls
    for cls in (OutOfMemory, QuotaExceeded, InvalidAddress, InvalidArgument, UnknownKernel,
                PermissionDenied, Unavailable, ProtocolError, InternalError)
}


def error_for(code: int, message: str) -> VgpuError:
    """The exception for a wire error code; an unknown code is a protocol
    error, as wire.DecodeError treats it."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return ProtocolError(f"error reply with unknown code {code}: {message}")
    return cls(message)
