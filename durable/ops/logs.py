"""Log formats of the command line (and of any process that runs a worker): plain text,
or one JSON object per line for a log collector.

The text format is ``time LEVEL logger: message``, the message never repeating the
logger's name. The JSON format (``tickwheel worker --log-format json``) writes::

    {"time": "2030-01-01T09:00:00.123+00:00", "level": "WARNING",
     "logger": "tickwheel.durable", "message": "job 'refund:2' (task refund) failed ...",
     "job_id": "refund:2", "task": "refund", "attempt": 1, "shard": 3,
     "exc": "Traceback (most recent call last): ..."}

``job_id``, ``task``, ``attempt``, ``shard`` (and ``reason``, ``lateness_ms``, ``store``,
``failed_calls``) appear when the line has them; ``exc`` is the formatted exception with
its traceback, when the line carries one.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

__all__ = ["FIELDS", "FORMATS", "TEXT_FORMAT", "JsonFormatter", "configure_logging"]

# The structured fields a line may carry (``extra=``), in output order.
FIELDS = (
    "job_id",
    "task",
    "attempt",
    "shard",
    "reason",
    "lateness_ms",
    "store",
    "failed_calls",
)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, the
    structured fields present, and ``exc`` (the traceback as text)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value if isinstance(value, (int, float, str)) else str(value)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(
    level: int, fmt: str = "text", stream: TextIO | None = None, logger: str = "tickwheel"
) -> logging.Handler:
    """Send ``logger``'s records at ``level`` and above to ``stream`` (stderr) in
    ``fmt`` ("text" or "json"); returns the handler added.

    Raises:
        ValueError: for an unknown format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger(logger)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
