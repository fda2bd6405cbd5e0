"""Checks a producer makes before anything is written: the task names it may schedule
(``tasks=``, checked when it is made and at each schedule)."""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["check_tasks", "known_task"]


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
