"""A plain synchronous script: schedule, move and cancel jobs with SyncScheduler.

    REDIS_URL=redis://localhost:6379/0 python schedule_reminders.py 3
    tickwheel worker reminders_tasks:registry --namespace reminders   # runs them

No event loop here: SyncScheduler is redis-py's sync client under the same scripts as
the asyncio Scheduler. It schedules reminders 0..N-1 (typed handles of the FastAPI
example's task), moves the last one earlier and cancels reminder 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "fastapi_reminders"))

from reminders_tasks import Reminder, send_reminder

from tickwheel.durable import SyncScheduler


def main(count: int) -> None:
    url = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
    namespace = os.environ.get("TICKWHEEL_NAMESPACE", "reminders")
    delay = float(os.environ.get("REMINDER_DELAY", "60"))
    with SyncScheduler.from_url(url, namespace) as jobs:
        for n in range(count):
            result = send_reminder.schedule_sync(
                Reminder(user=n, text=f"reminder {n}"),
                id=f"script:{n}",
                delay=delay,
                scheduler=jobs,
            )
            print(result.id, result.status.name, result.when_ms)
        print("moved", jobs.reschedule(f"script:{count - 1}", delay=delay / 2))
        print("cancelled", jobs.cancel("script:0"))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
