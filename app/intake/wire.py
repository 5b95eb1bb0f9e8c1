"""The intake server's wire codec, the one both ends use (``app.web.intake_server``, ``app.intake.client``).

A frame is a 4-byte big-endian length and a UTF-8 JSON value. A request is one prepared message
(``Prepared.to_wire``); the answer ``[row id, created, stream id]``, or ``{"error": reason}``
when it was not written. A connection carries one request at a time (every request thread of a
web process has a connection of its own), so answers need no tags.
"""

from __future__ import annotations

import json
import struct

from app.outbox.rows import Accepted, Prepared

HEADER = struct.Struct("!I")
MAX_FRAME = 1 << 20  # a callback body is at most 64 KiB (CALLBACK_MAX_BYTES); its message less


class FrameError(ValueError):
    """The peer does not speak the protocol: its connection is closed."""


def encode(value) -> bytes:
    """One frame holding ``value``."""
    data = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return HEADER.pack(len(data)) + data


def split(buffer: bytearray) -> list[bytes]:
    """The complete frames' payloads at the start of ``buffer``, taken out of it; what is left is
    the start of the next frame. ``FrameError`` for a frame larger than ``MAX_FRAME``."""
    found = []
    while len(buffer) >= HEADER.size:
        (size,) = HEADER.unpack_from(buffer)
        if size > MAX_FRAME:
            raise FrameError(f"frame of {size} bytes")
        if len(buffer) < HEADER.size + size:
            break
        found.append(bytes(buffer[HEADER.size:HEADER.size + size]))
        del buffer[:HEADER.size + size]
    return found


def request(prepared: Prepared) -> bytes:
    return encode(prepared.to_wire())


def read_request(payload: bytes) -> Prepared:
    """The prepared message of a request; ``ValueError`` or ``TypeError`` when it is not one."""
    return Prepared.from_wire(json.loads(payload))


def answer(outcome: Accepted | None, refusal: str) -> bytes:
    """The answer to a request: its row, or ``refusal`` when there is none."""
    if outcome is not None:
        return encode([outcome.id, outcome.created, outcome.stream_id])
    return encode({"error": refusal})


def read_answer(payload: bytes) -> Accepted | str:
    """The row an answer names, or the reason it was not written."""
    value = json.loads(payload)
    if isinstance(value, list) and len(value) == 3:
        return Accepted(*value)
    return str(value.get("error") if isinstance(value, dict) else value)
