"""What a payload may hold, and what a job's payload is when its record's cannot be decoded.

Ground rules:

- A payload is bytes (kept as is) or a JSON value that comes back from JSON the same:
  dicts with str keys, lists, str, int, float (finite), bool and None, nested at most
  :data:`MAX_PAYLOAD_DEPTH` lists and dicts deep. Anything else is refused when the job
  is scheduled (``store/_codec.py``: ``encode_payload``), naming the place in it.
- A record whose payload cannot be decoded (written by hand, or by a version that took
  what is refused now) is not an error of the batch it is claimed or listed in: its
  payload is an :class:`UndecodablePayload`, the runner dead-letters that one job with
  its reason, and the listings show it as undecodable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MAX_PAYLOAD_DEPTH", "UndecodablePayload", "payload_problem"]

# Lists and dicts nested in a payload, at most (a scalar is 0 deep, [1] is 1). Far below
# the interpreter's recursion limit (1000), so that decoding a payload, encoding it
# again (the dashboard, a broker) and a handler walking it all have room to spare.
MAX_PAYLOAD_DEPTH = 100


@dataclass(frozen=True, slots=True)
class UndecodablePayload:
    """The payload of a record that could not be decoded: its bytes and why."""

    data: bytes  # the payload's bytes as stored
    reason: str  # why it could not be decoded, e.g. "nested too deep (...)"

    def __str__(self) -> str:
        return f"undecodable payload: {self.reason}"


def _path(parent: str, key: object) -> str:
    return f"{parent}[{key!r}]"


def payload_problem(payload: object) -> tuple[type[Exception], str] | None:
    """The first thing in ``payload`` that would not come back the same from JSON, as
    the error class and message to raise (naming the path, e.g. ``payload[3]['a']``),
    or None. Iterative: never a RecursionError, however deep the value."""
    stack: list[tuple[object, str, int]] = [(payload, "payload", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_PAYLOAD_DEPTH:
                return ValueError, _too_deep(path)
            children = []
            for key, item in value.items():
                if not isinstance(key, str):
                    return TypeError, (
                        f"payload keys must be str, got {type(key).__name__} {key!r} in {path}"
                        " (JSON would turn it into a str)"
                    )
                if not key.isascii():
                    try:
                        key.encode()
                    except UnicodeEncodeError:
                        return ValueError, (
                            f"payload keys must be valid Unicode: {key!r} in {path} holds a"
                            " lone surrogate"
                        )
                children.append((item, _path(path, key), depth + 1))
            stack.extend(reversed(children))
        elif isinstance(value, list):
            if depth >= MAX_PAYLOAD_DEPTH:
                return ValueError, _too_deep(path)
            stack.extend(reversed([(v, _path(path, i), depth + 1) for i, v in enumerate(value)]))
        elif isinstance(value, tuple):
            return TypeError, (f"{path} is a tuple, which would come back as a list: pass a list")
        elif isinstance(value, str):
            try:
                value.encode()
            except UnicodeEncodeError:
                return ValueError, f"{path} is a str that is not valid Unicode (a lone surrogate)"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return TypeError, (
                    f"payload must be bytes or JSON-serialisable: {path} is {value!r}"
                    " (JSON has no NaN or Infinity)"
                )
        elif value is not None and not isinstance(value, int):  # bool is an int
            return TypeError, (
                f"payload must be bytes or JSON-serialisable: {path} is a {type(value).__name__}"
            )
    return None


def _too_deep(path: str) -> str:
    where = path if len(path) <= 60 else f"{path[:60]}..."
    return (
        f"payload must be nested at most {MAX_PAYLOAD_DEPTH} lists and dicts deep:"
        f" {where} is deeper"
    )
