"""Checks of the values callers hand the client: device addresses, sizes
and host buffers. Each refuses a bad value with InvalidArgument naming it,
before anything is sent, so a mistake is reported where it was made
rather than as a mediator error later (or, for a host buffer, as bytes
silently taken from the wrong place).
"""

from __future__ import annotations

import numbers
import operator

import numpy as np

from .errors import InvalidArgument


def address(v: object, what: str) -> int:
    """A device address given as a vgpu.Ptr or an int."""
    try:
        return operator.index(v)
    except TypeError:
        raise InvalidArgument(f"{what} {v!r} is not a device address (vgpu.Ptr or int)") from None


def integer(v: object, what: str) -> int:
    """v as an int: any integer type but bool (True is no count or offset)."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise InvalidArgument(f"{what} {v!r} is not a whole number")
    return int(v)


def positive(n: object, what: str) -> int:
    """A byte count, which must be a whole number of at least 1."""
    v = integer(n, what)
    if v < 1:
        raise InvalidArgument(f"{what} {v} is not positive")
    return v


def byte_view(data: object, writable: bool, what: str) -> np.ndarray:
    """data's bytes as a flat uint8 array sharing its memory: a numpy
    array, or any object with the buffer protocol (bytes, bytearray,
    memoryview, mmap). It must be C-contiguous, since the wire and the
    mediator's copies see memory as one run of bytes, and writable where
    the device writes into it."""
    if isinstance(data, np.ndarray):
        arr = data
    else:
        try:
            arr = np.frombuffer(memoryview(data), dtype=np.uint8)
        except (TypeError, ValueError, BufferError) as e:
            raise InvalidArgument(f"{what} of type {type(data).__name__} is not a contiguous buffer: {e}") from None
    if not arr.flags.c_contiguous:
        raise InvalidArgument(f"{what}: array of shape {arr.shape} and strides {arr.strides} is not C-contiguous")
    if writable and not arr.flags.writeable:
        raise InvalidArgument(f"{what} of type {type(data).__name__} is read-only")
    return arr.reshape(-1).view(np.uint8)


def data_address(arr: np.ndarray) -> int:
    """The address of arr's first byte in this process."""
    return arr.__array_interface__["data"][0]
