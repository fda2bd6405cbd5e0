"""A small typed application, checked by ``mypy --strict`` (tests/test_task_handles.py).

The lines ending in ``# type: ignore[...]`` are the mistakes mypy must catch: with
``warn_unused_ignores`` (part of ``--strict``) an ignore on a line that is not an error
is itself an error, so the check fails if any of them slips through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from tickwheel.durable import Scheduler, SyncScheduler, TaskContext, TaskRegistry

registry = TaskRegistry()


@dataclass
class ReminderArgs:
    user: int
    text: str = ""


class ChargeArgs(TypedDict):
    order: str
    cents: int


@registry.task
async def send_reminder(ctx: TaskContext, args: ReminderArgs) -> None:
    user: int = args.user
    assert user >= 0


@registry.task(name="billing.charge", timeout=30)
def charge(ctx: TaskContext, args: ChargeArgs) -> str:
    return args["order"]


@registry.task
async def untyped(ctx: TaskContext) -> None:
    pass


async def producer(s: Scheduler, ctx: TaskContext) -> None:
    await send_reminder.schedule(ReminderArgs(user=42), id="r:42", delay=60, scheduler=s)
    await charge.schedule({"order": "o1", "cents": 100}, id="c:o1", scheduler=s)
    await untyped.schedule({"anything": [1, 2]}, id="u", scheduler=s)
    await send_reminder.schedule(ReminderArgs(user=1), id="r:next", scheduler=ctx)
    spec = send_reminder.spec(ReminderArgs(user=7), id="r:7", delay=5)
    await s.schedule_many([spec])
    order: str = charge(ctx, {"order": "o1", "cents": 1})  # still the function
    assert order
    # The mistakes:
    await send_reminder.schedule({"user": 42}, id="r", scheduler=s)  # type: ignore[arg-type]
    await send_reminder.schedule("42", id="r", scheduler=s)  # type: ignore[arg-type]
    await charge.schedule(ReminderArgs(user=1), id="c", scheduler=s)  # type: ignore[arg-type]
    await charge.schedule({"order": "o1"}, id="c", scheduler=s)  # type: ignore[typeddict-item]


def sync_producer(s: SyncScheduler) -> None:
    charge.schedule_sync({"order": "o1", "cents": 100}, id="c:o1", scheduler=s)
    send_reminder.schedule_sync(ReminderArgs(user=3), id="r:3", delay=60, scheduler=s)
    send_reminder.schedule_sync(ReminderArgs(user="3"), id="r", scheduler=s)  # type: ignore[arg-type]
