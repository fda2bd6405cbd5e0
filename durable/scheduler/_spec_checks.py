"""Checks a producer makes before anything is written: the task names it may schedule
(``tasks=``, checked when it is made and at each schedule), and what the Postgres mode
does not take yet."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from tickwheel.durable.model import JobSpec

__all__ = ["check_tasks", "known_task", "refuse_pg_timeouts"]


def check_tasks(tasks: object) -> Collection[str] | None:
    """The ``tasks=`` of a producer: None (any name is scheduled), or a collection of
    task names (a ``TaskRegistry``, a set, ...), kept by reference (tasks registered
    later are known).

    Raises:
        TypeError: naming ``tasks``.
    """
    if tasks is None:
        return None
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Collection):
        raise TypeError(
            "tasks must be a collection of task names (a TaskRegistry, a set), "
            f"got {type(tasks).__name__}"
        )
    return tasks


def known_task(tasks: Collection[str] | None, task: str) -> None:
    """Refuse a task name that ``tasks`` (when given) does not hold.

    Raises:
        ValueError: naming ``task`` and the registered names.
    """
    if tasks is not None and task not in tasks:
        names = sorted(tasks)
        shown = ", ".join(map(repr, names[:20])) + (", ..." if len(names) > 20 else "")
        raise ValueError(f"task {task!r} is not registered (tasks= holds {shown or 'none'})")


def refuse_pg_timeouts(specs: Sequence[JobSpec]) -> None:
    """The Postgres mode has no job's own timeout yet (a retry rebuilds the record from
    the row's columns, which have none for it): refused before anything is written.

    Raises:
        ValueError: naming ``timeout``.
    """
    if any(spec.timeout_ms for spec in specs):
        raise ValueError("timeout= (a job's own timeout) is not in the Postgres mode yet")
