"""A task's flow limits (issue 35): at most ``concurrency`` runs at once and at most
``rate[0]`` starts per ``rate[1]`` seconds, per flow key (``schedule(key=)``; no key:
the task's single key). Declared on the task (``@registry.task(concurrency=,
rate=)``), stored in Redis by the workers that register it (docs/limits.md).

Ground rules:

- The stored form is one short text per task, ``"1 <concurrency> <n> <window ms>"``
  (version 1; 0 for a limit not set), so any worker reads what another wrote.
- A bad value is a clear error naming its parameter: TypeError for a wrong type (a
  bool is not a count), ValueError for a value out of range (0, negative, NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ._args import finite_seconds_ms, int_between

__all__ = ["MAX_CONCURRENCY", "MAX_RATE", "Limits", "check_limits"]

# Bounds that keep a key's permit and start sets small enough for one script call.
MAX_CONCURRENCY = 10_000
MAX_RATE = 10_000
# The longest rate window: a day.
MAX_WINDOW_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class Limits:
    """A task's limits per flow key (0: that limit is off)."""

    concurrency: int = 0  # runs at once per key
    rate_n: int = 0  # starts per window per key
    rate_ms: int = 0  # the window (ms)

    @property
    def on(self) -> bool:
        """True if any limit is set."""
        return bool(self.concurrency or self.rate_n)

    def encode(self) -> str:
        """The stored form (``{ns}:limits``, one field per task)."""
        return f"1 {self.concurrency} {self.rate_n} {self.rate_ms}"

    @classmethod
    def decode(cls, text: bytes | str) -> Limits:
        """The stored form read back; an unreadable one (a later version) is no limit."""
        raw = text.decode(errors="replace") if isinstance(text, bytes) else text
        parts = raw.split()
        if len(parts) != 4 or parts[0] != "1" or not all(p.isdigit() for p in parts[1:]):
            return cls()
        return cls(int(parts[1]), int(parts[2]), int(parts[3]))


def check_limits(
    concurrency: int | None, rate: tuple[int, float | timedelta] | None
) -> Limits | None:
    """The limits of ``@registry.task(concurrency=, rate=)``; None when neither is set.

    Raises:
        TypeError: naming ``concurrency`` or ``rate`` for a wrong type.
        ValueError: naming them for a value out of range (0, negative, NaN, infinite).
    """
    conc = 0
    if concurrency is not None:
        conc = int_between("concurrency", concurrency, 1, MAX_CONCURRENCY)
    rate_n = rate_ms = 0
    if rate is not None:
        if not isinstance(rate, tuple) or len(rate) != 2:
            raise TypeError(f"rate must be a tuple (n, seconds), got {rate!r}")
        rate_n = int_between("rate's n", rate[0], 1, MAX_RATE)
        try:
            rate_ms = finite_seconds_ms("rate's seconds", rate[1], minimum_ms=1)
        except ValueError as exc:
            raise ValueError(f"rate: {exc}") from None
        if rate_ms > MAX_WINDOW_MS:
            raise ValueError(f"rate's seconds must be at most a day, got {rate[1]!r}")
    if not conc and not rate_n:
        return None
    return Limits(conc, rate_n, rate_ms)
