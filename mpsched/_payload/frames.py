"""The frame in front of a payload's pickle: which shared-memory segment holds its large
buffers and where each sits in it, or, for a payload that carries its buffers itself, where
they follow the frame.

A framed payload starts with MAGIC (its buffers in a segment of mpsched._payload.shm, or
none) or CARRIED (its buffers after the frame); a plain pickle starts with its PROTO
opcode. Pure: bytes in, bytes out; the manager reads only the frame, never the pickle.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from mpsched._core.job import Payload

ALIGN = 64  # offset alignment of buffers in a segment (NumPy views want aligned data)
MAGIC = b"MPS\x05"  # first bytes of a framed payload; a pickle starts with b"\x80"
CARRIED = b"MPS\x06"  # the same, for a payload that carries its buffers itself
_HEAD = struct.Struct("!4sHQH")  # magic, name length, segment size, buffer count
_ENTRY = struct.Struct("!QQ?")  # offset, length, read-only


class BufferEntry(NamedTuple):
    """Where one out-of-band buffer sits in a segment."""

    offset: int
    length: int
    readonly: bool


class Frame(NamedTuple):
    """A framed payload, parsed: its segment (``""`` for none), the buffers in it, where
    they start when the payload carries them itself (no segment: see :func:`carry`), and
    where the pickle starts."""

    segment: str
    size: int
    entries: tuple[BufferEntry, ...]
    data: int
    body: int


def layout(buffers: Sequence[memoryview]) -> tuple[int, tuple[BufferEntry, ...]]:
    """Where ``buffers`` go in a segment (each at an aligned offset), and its size."""
    entries = []
    offset = 0
    for buffer in buffers:
        entries.append(BufferEntry(offset=offset, length=buffer.nbytes, readonly=buffer.readonly))
        offset += -(-buffer.nbytes // ALIGN) * ALIGN
    return offset, tuple(entries)


def frame(segment: str, size: int, entries: Sequence[BufferEntry], body: bytes) -> bytes:
    """A payload: the frame (segment name, size, buffer table) followed by the pickle.

    Payloads without a segment are framed too when their client reads shared memory:
    the frame then tells the worker that a large result may come back that way.
    """
    if not segment and not entries:
        return _EMPTY_HEAD + body
    return b"".join([_head(MAGIC, segment, size, entries), body])


def _head(magic: bytes, segment: str, size: int, entries: Sequence[BufferEntry]) -> bytes:
    encoded = segment.encode()
    parts = [_HEAD.pack(magic, len(encoded), size, len(entries)), encoded]
    parts += [_ENTRY.pack(*entry) for entry in entries]
    return b"".join(parts)


_EMPTY_HEAD = _head(MAGIC, "", 0, ())  # the frame of a payload with no buffers
_EMPTY_FRAME = Frame(segment="", size=0, entries=(), data=_HEAD.size, body=_HEAD.size)


def carry(buffers: Sequence[memoryview], body: bytes) -> bytes:
    """A payload that carries its out-of-band ``buffers`` itself, where no shared memory
    can: the frame (no segment), the buffers as :func:`layout` places them, the pickle.
    Built with one copy of each buffer, where pickling them in band takes several."""
    size, entries = layout(buffers)
    parts: list[bytes | memoryview] = [_head(CARRIED, "", size, entries)]
    for entry, buffer in zip(entries, buffers, strict=True):
        parts.append(buffer)
        parts.append(bytes(-entry.length % ALIGN))
    parts.append(body)
    return b"".join(parts)


def parse(payload: Payload | memoryview) -> Frame | None:
    """The frame of a framed payload; None for a plain pickle."""
    magic = payload[:4]
    if magic != MAGIC and magic != CARRIED:
        return None
    if payload[: _HEAD.size] == _EMPTY_HEAD:
        return _EMPTY_FRAME
    _, length, size, count = _HEAD.unpack_from(payload)
    start = _HEAD.size + length
    segment = bytes(payload[_HEAD.size : start]).decode()
    entries = tuple(
        BufferEntry._make(_ENTRY.unpack_from(payload, start + i * _ENTRY.size))
        for i in range(count)
    )
    data = start + count * _ENTRY.size
    return Frame(
        segment=segment,
        size=size,
        entries=entries,
        data=data,
        body=data + (size if magic == CARRIED else 0),
    )


def carried(
    size: int, entries: Sequence[BufferEntry], data: bytes | bytearray, body: bytes | memoryview
) -> bytes:
    """A payload that carries ``data`` (``size`` bytes, its buffers where ``entries`` say)
    after its frame, then the pickle ``body``."""
    return b"".join([_head(CARRIED, "", size, entries), data, body])


def inline_buffers(payload: Payload, parsed: Frame) -> list[bytearray | memoryview]:
    """The buffers a payload made by :func:`carry` or :func:`carried` holds, for
    ``pickle.loads``: read-only ones as views of it, writable ones as copies (a job may
    write to those)."""
    view = memoryview(payload)
    buffers: list[bytearray | memoryview] = []
    for entry in parsed.entries:
        part = view[parsed.data + entry.offset : parsed.data + entry.offset + entry.length]
        buffers.append(part if entry.readonly else bytearray(part))
    return buffers


def unframed(payload: Payload) -> Payload:
    """A payload framed with no segment and no buffers (:func:`frame`), as the plain
    pickle it frames; any other payload as it is."""
    if payload[: _HEAD.size] == _EMPTY_HEAD:
        return payload[_HEAD.size :]
    return payload


def segment_of(payload: Payload) -> str:
    """The name of the segment a payload refers to; "" for none."""
    if payload[:4] != MAGIC:
        return ""
    _, length, _, _ = _HEAD.unpack_from(payload)
    return payload[_HEAD.size : _HEAD.size + length].decode() if length else ""


def segment_size(payload: Payload) -> int:
    """The size of the segment a framed payload refers to (0 for none)."""
    return int(_HEAD.unpack_from(payload)[2]) if payload[:4] == MAGIC else 0
