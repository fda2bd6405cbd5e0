"""The refusals the dashboard answers with, and the checks of what an operator types.

A refusal is an :class:`ActionError`: an HTTP status and one sentence an operator can act
on (a bad id or form value is a 400, a missing job a 404, an action on a job that moved
on a 409), never a 500 for what was typed. Every check here names the field it refuses.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from tickwheel.durable.model import check_job_id

__all__ = [
    "MAX_WHEN_MS",
    "ActionError",
    "NotFound",
    "Stale",
    "check_shard",
    "checked_id",
    "digits",
    "parse_when",
    "seconds",
    "whole_number",
]

# The last epoch ms a datetime can show (9999-12-31T23:59:59.999Z).
MAX_WHEN_MS = 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class ActionError(Exception):
    """A request the dashboard refuses or cannot serve: an HTTP status and a sentence."""

    status = 400

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFound(ActionError):
    """No such job (404)."""

    status = 404


class Stale(ActionError):
    """The job moved on since the page was loaded (409): nothing was written."""

    status = 409


def checked_id(job_id: str) -> str:
    """``job_id`` if it is a valid id, else ActionError (400) naming ``job_id``."""
    try:
        return check_job_id(job_id)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None


def digits(text: str) -> bool:
    """Is ``text`` ASCII digits only (``str.isdigit`` also takes "²", which ``int``
    refuses)."""
    return text.isascii() and text.isdigit()


def check_shard(shard: int, shards: int) -> None:
    """Refuse (400) a shard number outside ``range(shards)``."""
    if not 0 <= shard < shards:
        raise ActionError(f"shard must be a number from 0 to {shards - 1}, got {shard}")


def parse_when(text: str) -> int:
    """Epoch ms of an ISO 8601 time with a zone (``Z`` allowed) or of epoch ms digits.

    Raises:
        ActionError: (400) naming ``at``.
    """
    text = text.strip()
    if digits(text):
        ms = int(text)
    else:
        try:
            when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ActionError(
                f"at must be ISO 8601 with a zone or epoch ms, got {text!r}"
            ) from None
        if when.tzinfo is None:
            raise ActionError(f"at must carry a zone (for example Z), got {text!r}")
        try:
            ms = (when - _EPOCH) // timedelta(milliseconds=1)
        except OverflowError:  # past year 9999 in UTC
            ms = MAX_WHEN_MS + 1
    if not 0 <= ms <= MAX_WHEN_MS:
        raise ActionError(f"at must be between 1970 and 9999, got {text!r}")
    return ms


def whole_number(text: str, name: str) -> int:
    """The integer ``text`` spells (a query parameter), else ActionError naming ``name``."""
    text = text.strip()
    if not digits(text.removeprefix("-")) or len(text) > 18:
        raise ActionError(f"{name} must be a whole number, got {text!r}")
    return int(text)


def seconds(text: str) -> float:
    """A delay in seconds, 0 to 1e10, else ActionError naming ``delay``."""
    try:
        value = float(text)
    except ValueError:
        raise ActionError(f"delay must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or value > 10**10:
        raise ActionError(f"delay must be 0 to 1e10 seconds, got {text!r}")
    return value
