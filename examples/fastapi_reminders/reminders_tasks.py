"""The reminder task, run by ``tickwheel worker reminders_tasks:registry``.

A real service would send a mail or a push here. The example appends one JSON line per
run to ``$REMINDERS_LOG`` (or prints it), which its test reads.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


@dataclass
class Reminder:
    user: int
    text: str


@registry.task(name="reminders.send")
def send_reminder(ctx: TaskContext, reminder: Reminder) -> None:
    """Deliver one reminder (the worker gives ``reminder`` as a ``Reminder``)."""
    line = json.dumps(
        {
            "id": ctx.job_id,
            "nominal_ms": ctx.nominal_ms,
            "ran_ms": int(time.time() * 1000),
            "user": reminder.user,
            "text": reminder.text,
        }
    )
    path = os.environ.get("REMINDERS_LOG")
    if path is None:
        print(line, flush=True)
        return
    with open(path, "a") as log:
        log.write(line + "\n")
