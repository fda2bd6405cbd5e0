"""Msgpack bytes by hand: what the scripts decode with ``cmsgpack``, and their replies.

Ground rules:

- Only what the job record and the batches need: non-negative ints, bytes (packed as
  msgpack *str*, as Redis's cmsgpack packs Lua strings) and one flat array.
- The output is byte for byte what ``cmsgpack.pack`` in ``lua/_lib.lua`` produces for
  the same values (smallest int and str headers), so a record written here and one
  re-encoded by a script are the same size (pinned by a test).
- Nothing here knows a job: the record's fields and their order are ``_codec.py``'s.

Encoding here rather than in Lua takes the per-job table building out of the script,
which blocks Redis; see bench/suites/bench_durable.py (batch schedule).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any

import msgpack  # type: ignore[import-untyped]

__all__ = [
    "FAR_SLOT_MS",
    "FIXINT",
    "pack_ack_batch",
    "pack_array",
    "pack_schedule_batch",
    "pack_str",
    "pack_value",
    "unpack_far_chunk",
    "unpack_far_ids",
    "unpack_reply",
]

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
# Smallest headers by value, looked up instead of computed: ints 0..127 (positive
# fixint) and the fixstr headers of 0..31 bytes.
FIXINT = tuple(bytes((i,)) for i in range(0x80))
_FIXSTR = tuple(bytes((0xA0 | n,)) for n in range(32))
_STR8 = struct.Struct(">BB")
_STR16 = struct.Struct(">BH")
_UINT64_MAX = (1 << 64) - 1
_ACK_TAIL = struct.Struct(">BQBQBQBH")  # 0xcf attempt, 0xcf nominal, 0xcf next, 0xcd bucket


def pack_value(value: int | bytes) -> bytes:
    """One msgpack value: a non-negative int or bytes (as str).

    Raises:
        ValueError: for a negative int or one of 2**64 or more.
    """
    if isinstance(value, bytes):
        return pack_str(value)
    if value < 0:
        raise ValueError(f"value must be >= 0, got {value}")
    if value < 0x80:
        return FIXINT[value]
    if value < 0x100:
        return b"\xcc" + _U8.pack(value)
    if value < 0x10000:
        return b"\xcd" + _U16.pack(value)
    if value < 0x100000000:
        return b"\xce" + _U32.pack(value)
    return b"\xcf" + _U64.pack(value)


def pack_str(data: bytes) -> bytes:
    """``data`` as msgpack str, smallest header (what cmsgpack packs)."""
    n = len(data)
    if n < 32:
        return _FIXSTR[n] + data
    if n < 0x100:
        return _STR8.pack(0xD9, n) + data
    if n < 0x10000:
        return _STR16.pack(0xDA, n) + data
    return b"\xdb" + _U32.pack(n) + data


def _array_head(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + _U16.pack(n)
    return b"\xdd" + _U32.pack(n)


def pack_ack_batch(items: Sequence[tuple[bytes, int, int, int, int]]) -> bytes:
    """ack.lua's batch: a msgpack array of id, attempt, nominal, next, bucket per job.
    The ints are uint64 of fixed width (cmsgpack reads any width; this batch is never
    compared with bytes a script packs), the bucket a uint16, so one struct call packs
    the four.

    Raises:
        ValueError: for an int outside 0 .. 2**64 - 1 (a bucket outside 0 .. 65535).
    """
    parts = [_array_head(5 * len(items))]
    append = parts.append
    tail = _ACK_TAIL.pack
    try:
        for ident, attempt, nominal, nxt, bucket in items:
            append(pack_str(ident))
            append(tail(0xCF, attempt, 0xCF, nominal, 0xCF, nxt, 0xCD, bucket))
    except struct.error as exc:
        raise ValueError(f"ack values must be in 0 .. 2**64 - 1: {exc}") from None
    return b"".join(parts)


def pack_schedule_batch(items: Sequence[tuple[bytes, int, int, bytes]]) -> bytes:
    """schedule.lua's batch: a msgpack array of id, mode (0 or 1), time, record per
    job, packed by ``msgpack``'s C packer (bytes as msgpack str, as cmsgpack reads them;
    the batch is never compared with bytes a script packs): 96 against 319 ns a job
    packed value by value here. (The ack batch, fixed-width, is packed as fast by one
    struct call per job: measured the same both ways, so it stays.)

    Raises:
        ValueError: for a mode other than 0 and 1, or a time outside 0 .. 2**64 - 1.
    """
    flat: list[Any] = list(chain.from_iterable(items))
    if len(flat) != 4 * len(items):
        raise ValueError(f"batch items must have 4 values each, got {len(flat)} values")
    times = flat[2::4]  # checked a column at a time, by C builtins
    if times and (min(times) < 0 or max(times) > _UINT64_MAX):
        raise ValueError("schedule times must be in 0 .. 2**64 - 1")
    modes = set(flat[1::4])
    if not modes <= {0, 1}:
        raise ValueError(f"mode must be 0 or 1, got {sorted(modes - {0, 1}, key=repr)[0]}")
    return bytes(msgpack.packb(flat, use_bin_type=False))


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


# The far index's slot width (ms): lua/_lib.lua's FAR_SLOT (tests/test_durable_far.py
# holds the two equal).
FAR_SLOT_MS = 60_000


def unpack_far_chunk(member: bytes) -> tuple[int, bool, list[str]]:
    """One member of a ``{ns:s}:far`` index (lua/_lib.lua: far_push): its slot start
    (ms), whether it marks the slot's open chunk (whose ids are the field of that slot
    in ``{ns:s}:faro``: :func:`unpack_far_ids`), and a full chunk's ids.

    Raises:
        ValueError: if ``member`` is not of that form.
    """
    head, sep, rest = member.partition(b":")
    if not sep or not head.isdigit() or rest[:1] not in (b"0", b"1") or rest == b"1":
        raise ValueError(f"member is not a far index chunk: {member[:40]!r}")
    if rest[:1] == b"0":
        if len(rest) > 1:
            raise ValueError(f"member is not a far index chunk: {member[:40]!r}")
        return int(head), True, []
    return int(head), False, unpack_far_ids(rest[1:])


def unpack_far_ids(blob: bytes) -> list[str]:
    """The job ids of a far index chunk: msgpack strs, back to back.

    Raises:
        ValueError: if ``blob`` is not that.
    """
    ids: list[str] = []
    i, end = 0, len(blob)
    while i < end:
        b = blob[i]
        if 0xA0 <= b <= 0xBF:
            n, i = b & 0x1F, i + 1
        elif b == 0xD9 and i + 2 <= end:
            n, i = blob[i + 1], i + 2
        elif b == 0xDA and i + 3 <= end:
            n, i = _U16.unpack_from(blob, i + 1)[0], i + 3
        else:
            raise ValueError(f"far chunk has a bad id header 0x{b:02x} at byte {i}")
        if i + n > end:
            raise ValueError("far chunk ends inside an id")
        ids.append(blob[i : i + n].decode())
        i += n
    return ids


def unpack_reply(data: bytes) -> list[Any]:
    """A script's reply sent as one msgpack array (claim.lua): strs as bytes, ints as
    ints. The C decoder of ``msgpack`` reads it faster than Redis would have converted
    the same Lua table to RESP (and than the client would have read that).

    Raises:
        ValueError: if ``data`` is not the bytes of a msgpack array.
    """
    try:
        value = msgpack.unpackb(data, raw=True)
    # Nesting cannot recurse: msgpack's C unpacker and its pure-Python fallback both keep
    # a stack of their own (too deep: StackError, a ValueError); RecursionError is caught
    # as well, should a version recurse.
    except (TypeError, ValueError, RecursionError, msgpack.UnpackException) as exc:
        raise ValueError(f"reply is not msgpack: {exc}") from None
    if not isinstance(value, list):
        raise ValueError(f"reply is not a msgpack array: {type(value).__name__}")
    return value
