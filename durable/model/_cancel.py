"""What a cancel found: :class:`CancelResult`."""

from __future__ import annotations

import enum

__all__ = ["CancelResult"]


class CancelResult(enum.Enum):
    """What :meth:`Scheduler.cancel_job` did.

    ``STOPPED`` means the job was leased (running, or claimed and about to run): its
    record is gone, and the worker holding it was told to stop its handler. The handler
    sees ``CancelledError`` within the bound of docs/design.md (a pub/sub message,
    normally milliseconds; without it, at the handler's next lease extension), and the
    run ends neither acked nor retried.
    """

    NOT_FOUND = "not_found"  # no such job (done, never scheduled, or cancelled before)
    REMOVED = "removed"  # removed before it ran (due, or in the dead letters)
    STOPPED = "stopped"  # removed while leased: its running handler is stopped
