"""``inspect --key KEY --task TASK``: one flow key's permits (issue 35, docs/limits.md):
runs holding them, jobs waiting, the next release and the rate window."""

from __future__ import annotations

import argparse
from typing import Any

from tickwheel.durable.model import check_key, check_task_name
from tickwheel.durable.scheduler import Scheduler

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

__all__ = ["inspect_key"]


def key_data(state: Any) -> dict[str, Any]:
    """A :class:`KeyState` as the JSON output's fields."""
    lim = state.limits
    return {
        "task": state.task,
        "key": state.key,
        "concurrency": lim.concurrency,
        "rate": [lim.rate_n, lim.rate_ms / 1000] if lim.rate_n else None,
        "running": state.running,
        "waiting": state.waiting,
        "handed": state.handed,
        "next_release": iso(state.next_release_ms) if state.next_release_ms >= 0 else None,
        "next_start": iso(state.next_start_ms) if state.next_start_ms >= 0 else None,
        "window_starts": state.window_starts,
    }


def inspect_key(args: argparse.Namespace) -> int:
    """``inspect --key``: needs ``--task`` (the limits are a task's)."""
    try:
        if args.task is None:
            raise CliError(EXIT_USAGE, "--key needs --task (a key's limits are its task's)")
        try:
            check_task_name(args.task, "--task")
            check_key(args.key)
        except (TypeError, ValueError) as exc:
            raise CliError(EXIT_USAGE, f"--{exc}") from exc
    except CliError as error:
        return fail(args, error)

    async def body(scheduler: Scheduler) -> int:
        state = await scheduler.key_state(args.task, args.key)
        data = key_data(state)

        def text() -> str:
            lim = state.limits
            limits = []
            if lim.concurrency:
                limits.append(f"concurrency {lim.concurrency}")
            if lim.rate_n:
                limits.append(f"rate {lim.rate_n} per {lim.rate_ms / 1000:g}s")
            lines = [
                f"task {state.task!r} key {state.key!r}: {', '.join(limits) or 'no limits'}",
                f"  running {state.running}, waiting {state.waiting}, handed {state.handed}",
            ]
            if data["next_release"]:
                lines.append(f"  next permit deadline {data['next_release']}")
            if data["next_start"]:
                lines.append(f"  next booked start {data['next_start']}")
            if lim.rate_n:
                lines.append(f"  starts in the current window: {state.window_starts}")
            return "\n".join(lines)

        emit(args, data, text)
        return EXIT_OK

    return run(args, lambda: with_scheduler(args, body, absent=lambda: not_created(args, {})))
