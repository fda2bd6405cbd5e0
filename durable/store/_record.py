"""A minimal msgpack encoder for what the scripts decode with ``cmsgpack``.

Ground rules:

- Only what the job record and the schedule batch need: non-negative ints, bytes
  (packed as msgpack *str*, as Redis's cmsgpack packs Lua strings) and one flat array.
- The output is byte for byte what ``cmsgpack.pack`` in ``lua/_lib.lua`` produces for
  the same values (smallest int and str headers), so a record written here and one
  re-encoded by a script are the same size (pinned by a test).
- Field order and defaults mirror ``lua/_lib.lua``; trailing defaults are dropped.

Encoding here rather than in Lua takes the per-job table building out of the script,
which blocks Redis; see bench/bench_durable.py (batch schedule).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

__all__ = ["DEFAULTS", "FIELDS", "pack_array", "pack_record", "pack_value"]

# The job record's fields, in record order: lua/_lib.lua's F_* constants, lowercased
# (F_TASK = 1, ...). tests/test_durable_store.py holds the two sides equal.
FIELDS = (
    "task",
    "payload",
    "max",
    "flags",
    "nominal",
    "attempt",
    "epoch",
    "rkind",
    "rspec",
    "policy",
    "cap",
    "grace",
    "error",
)
# Their defaults, in the same order (lua/_lib.lua: DEFAULTS); trailing ones are dropped.
DEFAULTS: tuple[int | bytes, ...] = (b"", b"", 5, 0, 0, 1, 0, 0, b"", 0, 0, 0, b"")

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def pack_value(value: int | bytes) -> bytes:
    """One msgpack value: a non-negative int or bytes (as str).

    Raises:
        ValueError: for a negative int or one of 2**64 or more.
    """
    if isinstance(value, bytes):
        n = len(value)
        if n < 32:
            return bytes((0xA0 | n,)) + value
        if n < 0x100:
            return b"\xd9" + _U8.pack(n) + value
        if n < 0x10000:
            return b"\xda" + _U16.pack(n) + value
        return b"\xdb" + _U32.pack(n) + value
    if value < 0:
        raise ValueError(f"value must be >= 0, got {value}")
    if value < 0x80:
        return bytes((value,))
    if value < 0x100:
        return b"\xcc" + _U8.pack(value)
    if value < 0x10000:
        return b"\xcd" + _U16.pack(value)
    if value < 0x100000000:
        return b"\xce" + _U32.pack(value)
    return b"\xcf" + _U64.pack(value)


def pack_record(fields: Sequence[int | bytes]) -> bytes:
    """A job record: the fields as a msgpack stream, trailing defaults dropped."""
    n = len(fields)
    while n and fields[n - 1] == DEFAULTS[n - 1]:
        n -= 1
    return b"".join([pack_value(f) for f in fields[:n]])


def pack_array(values: Sequence[int | bytes]) -> bytes:
    """A msgpack array of ints and bytes."""
    n = len(values)
    if n < 16:
        head = bytes((0x90 | n,))
    elif n < 0x10000:
        head = b"\xdc" + _U16.pack(n)
    else:
        head = b"\xdd" + _U32.pack(n)
    return head + b"".join([pack_value(v) for v in values])
