"""The argument checks, in one place: each turns an option's text into a value or refuses it."""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timedelta
from typing import Any, Protocol

from tickwheel.durable.model import MIN_AT_MS
from tickwheel.durable.scheduler import (
    DEFAULT_SHARDS,
    MAX_BATCH,
)
from tickwheel.durable.store import (
    URL_ENV,
)

from ._common import EPOCH, EXIT_USAGE, MAX_WHEN_MS, PG_URL_ENV, CliError, digits


def json_payload(text: str | None) -> Any:
    if text is None:
        return b""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(EXIT_USAGE, f"payload must be JSON, got {_clip(text)} ({exc})") from None
    except RecursionError:
        raise CliError(
            EXIT_USAGE, f"payload is nested too deep to decode, got {_clip(text)}"
        ) from None


def _clip(text: str, limit: int = 80) -> str:
    """``text`` quoted, cut to about ``limit`` characters for a message."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} chars)"


def at_time(text: str | None) -> int | datetime | None:
    """``--at``: epoch ms, or an ISO 8601 time with a zone (``Z`` for UTC), from
    2000-01-01 on (an earlier time is a mistake, such as epoch seconds)."""
    if text is None:
        return None
    if digits(text):
        ms = int(text)
        when: int | datetime = ms
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise CliError(
                EXIT_USAGE,
                f"--at must be epoch ms or ISO 8601 (2030-01-01T09:00:00Z), got {text!r}",
            ) from None
        if when.tzinfo is None:
            raise CliError(EXIT_USAGE, f"--at needs a time zone (add Z for UTC), got {text!r}")
        try:
            ms = (when - EPOCH) // timedelta(milliseconds=1)
        except OverflowError:  # past year 9999 in UTC
            ms = MAX_WHEN_MS + 1
    if not 0 <= ms <= MAX_WHEN_MS:
        raise CliError(
            EXIT_USAGE,
            f"--at must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z "
            f"(epoch ms 0..{MAX_WHEN_MS}), got {text!r}",
        )
    if ms < MIN_AT_MS:
        unit = " (epoch seconds? --at takes milliseconds)" if text.isdigit() else ""
        raise CliError(
            EXIT_USAGE,
            f"--at must be on or after 2000-01-01T00:00:00Z (epoch ms {MIN_AT_MS}), "
            f"got {text!r}{unit}",
        )
    return when


def delay_seconds(option: str, seconds: float | None) -> float | None:
    """``--delay`` or ``--every``, checked to fall due before year 10000 (by this host's
    clock, with a day of slack for a Redis clock ahead of it)."""
    if seconds is None:
        return None
    most = (MAX_WHEN_MS - time.time() * 1000) / 1000 - 86400
    if seconds > most:
        raise CliError(
            EXIT_USAGE,
            f"{option} must fall due before year 10000 (at most {most:.0f} s), got {seconds:g}",
        )
    return seconds


def whole(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise argparse.ArgumentTypeError(f"expected a number {bound}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole(text, 1)


def batch_size(text: str) -> int:
    return whole(text, 1, MAX_BATCH)


def non_negative_int(text: str) -> int:
    return whole(text, 0)


def port(text: str) -> int:
    return whole(text, 0, 65535)


def finite_float(text: str, *, zero_ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        bound = ">= 0" if zero_ok else "> 0"
        raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text}")
    return value


def positive_float(text: str) -> float:
    return finite_float(text, zero_ok=False)


def non_negative_float(text: str) -> float:
    return finite_float(text, zero_ok=True)


def common_options(*, with_json: bool = True) -> argparse.ArgumentParser:
    """The options every Redis command takes (the worker has no ``--json``: it always
    prints its started and stopped events as JSON lines)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=os.environ.get(URL_ENV) or None,
        help=f"redis://host:port/db (default ${URL_ENV})",
    )
    common.add_argument(
        "--postgres-url",
        default=os.environ.get(PG_URL_ENV) or None,
        help=f"postgresql://...: the Postgres mode (default ${PG_URL_ENV})",
    )
    common.add_argument("--namespace", default="tickwheel", help="key namespace")
    common.add_argument(
        "--shards", type=positive_int, default=DEFAULT_SHARDS, help="the namespace's shard count"
    )
    if with_json:
        common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log to stderr (-vv: debug; worker -v: debug)",
    )
    return common


class AddCommand(Protocol):
    """Makes one subcommand's parser (the ``add`` of ``tickwheel``'s parser)."""

    def __call__(self, name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser: ...
