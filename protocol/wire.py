"""Bounded binary reading and writing for pulse's own formats.

`Reader` never reads past the buffer it was given and raises a specific `MalformedPayload`
subclass for every way peer bytes can be wrong: truncation, trailing bytes, a varint that is
too long, or a count above the caller's bound.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from protocol.errors import SizeLimitExceeded, TrailingBytes, TruncatedPayload

_MAX_VARINT_BYTES = 10  # enough for 2**64 - 1


class Writer:
    """Appends fields to a growing byte buffer."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def raw(self, data: bytes) -> None:
        self._parts.append(data)

    def u8(self, value: int) -> None:
        self._parts.append(struct.pack("<B", value))

    def varint(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"varint must be non-negative, got {value}")
        out = bytearray()
        while True:
            byte = value & 0x7F
            value >>= 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                break
        self._parts.append(bytes(out))

    def blob(self, data: bytes) -> None:
        """Length-prefixed bytes."""
        self.varint(len(data))
        self._parts.append(data)

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads fields from `data`, raising instead of ever reading out of bounds."""

    def __init__(self, data: bytes | memoryview, what: str = "payload") -> None:
        self._buf = memoryview(data)
        self._pos = 0
        self.what = what
        self.ended = False  # `expect_end` passed: every field was read

    @property
    def remaining(self) -> int:
        return len(self._buf) - self._pos

    def raw(self, n: int) -> memoryview:
        if n < 0 or n > self.remaining:
            raise TruncatedPayload(f"{self.what}: needs {n} more bytes at offset {self._pos}, has {self.remaining}")
        view = self._buf[self._pos : self._pos + n]
        self._pos += n
        return view

    def peek(self) -> memoryview:
        """Every byte not read yet, without consuming any (for a parser that reports its length)."""
        return self._buf[self._pos :]

    def u8(self) -> int:
        return int(self.raw(1)[0])

    def unpack(self, fmt: str) -> tuple[Any, ...]:
        """Fixed-size fields in `struct` format (`fmt` gives the byte order)."""
        return struct.unpack(fmt, self.raw(struct.calcsize(fmt)))

    def varint(self, bound: int, field: str) -> int:
        """A LEB128 integer that must be <= bound; `field` names it in errors."""
        value = 0
        for i in range(_MAX_VARINT_BYTES):
            byte = self.u8()
            value |= (byte & 0x7F) << (7 * i)
            if not byte & 0x80:
                if value > bound:
                    raise SizeLimitExceeded(f"{self.what}: {field} = {value} exceeds its bound {bound}")
                return value
        raise SizeLimitExceeded(f"{self.what}: varint for {field} is longer than {_MAX_VARINT_BYTES} bytes")

    def blob(self, bound: int, field: str) -> memoryview:
        return self.raw(self.varint(bound, field))

    def u32_array(self, count: int) -> np.ndarray:
        return np.frombuffer(self.raw(4 * count), dtype="<u4").astype(np.uint32)

    def u16_array(self, count: int) -> np.ndarray:
        """`count` little-endian u16 (a native, aligned copy)."""
        return np.frombuffer(self.raw(2 * count), dtype="<u2").astype(np.uint16)

    def expect_end(self) -> None:
        if self.remaining:
            raise TrailingBytes(f"{self.what}: {self.remaining} bytes after the last field")
        self.ended = True
