"""The pause commands: ``pause`` and ``resume`` (a task, or the whole namespace)."""

from __future__ import annotations

import argparse

from tickwheel.durable.model import check_task_name
from tickwheel.durable.scheduler import Scheduler

from ._args import AddCommand
from ._common import (
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    emit,
    fail,
    iso,
    not_created,
    run,
    with_scheduler,
)


def _what(task: str | None) -> str:
    return f"task {task!r}" if task is not None else "the whole namespace"


def paused_rows(state: dict[str | None, int]) -> list[dict[str, object]]:
    """The pause state as rows: task (None: the whole namespace) and since."""
    return [
        {"task": task, "since_ms": since, "since": iso(since)}
        for task, since in sorted(state.items(), key=lambda kv: (kv[0] is not None, kv[0] or ""))
    ]


def _checked(args: argparse.Namespace) -> CliError | None:
    if args.task is None:
        return None
    try:
        check_task_name(args.task, "--task")
    except (TypeError, ValueError) as exc:
        return CliError(EXIT_USAGE, str(exc))
    return None


def _pause(args: argparse.Namespace) -> int:
    error = _checked(args)
    if error is not None:  # before anything is written
        return fail(args, error)

    async def body(scheduler: Scheduler) -> int:
        if args.action == "pause":
            await scheduler.pause(args.task)
            state = await scheduler.paused()
            text = f"paused {_what(args.task)}: its due jobs wait until a resume"
            emit(args, {"paused": paused_rows(state)}, text)
            return EXIT_OK
        moved = await scheduler.resume(args.task)
        state = await scheduler.paused()
        text = f"resumed {_what(args.task)}: {moved} waiting jobs back to due"
        if state:
            still = ", ".join(_what(t) for t in state)
            text += f"; still paused: {still}"
        emit(args, {"moved": moved, "paused": paused_rows(state)}, text)
        return EXIT_OK

    def absent() -> int:
        return not_created(args, {"moved": 0, "paused": []}, "nothing to resume: ")

    pausing = args.action == "pause"  # pausing a namespace not yet created creates it
    return run(args, lambda: with_scheduler(args, body, absent=None if pausing else absent))


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add ``pause`` and ``resume`` (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    for action, text in (
        ("pause", "pause a task (or the whole namespace): its due jobs are not claimed"),
        ("resume", "resume a task (or the namespace): its waiting jobs run in due order"),
    ):
        cmd = add(action, text, parents=[common])
        cmd.add_argument(
            "--task", help="the task name (a task no worker registers yet may be paused)"
        )
        cmd.set_defaults(func=_pause, action=action)
