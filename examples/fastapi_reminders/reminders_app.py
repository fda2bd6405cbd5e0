"""A FastAPI service that schedules, cancels and reschedules reminders.

Run it beside a worker (two processes; see README.md)::

    uvicorn reminders_app:app --port 8000
    tickwheel worker reminders_tasks:registry --namespace reminders
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from reminders_tasks import Reminder, send_reminder

from tickwheel.durable import Scheduler, connect

REDIS_URL = os.environ.get("REDIS_URL", "redis://localhost:6379/0")
NAMESPACE = os.environ.get("TICKWHEEL_NAMESPACE", "reminders")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    client = await connect(REDIS_URL)
    app.state.scheduler = Scheduler(client, NAMESPACE)
    try:
        yield
    finally:
        await app.state.scheduler.close()
        await client.aclose()


app = FastAPI(title="reminders", lifespan=lifespan)


class NewReminder(BaseModel):
    id: str = Field(min_length=1, max_length=200)
    user: int
    text: str
    delay: float = Field(ge=0)  # seconds from now


class Move(BaseModel):
    delay: float = Field(ge=0)


def _scheduler() -> Scheduler:
    sched: Scheduler = app.state.scheduler
    return sched


@app.post("/reminders", status_code=201)
async def create(body: NewReminder) -> dict[str, Any]:
    """Schedule a reminder; the same id again keeps the first (status KEPT)."""
    result = await send_reminder.schedule(
        Reminder(user=body.user, text=body.text),
        id=body.id,
        delay=body.delay,
        scheduler=_scheduler(),
    )
    return {"id": result.id, "status": result.status.name, "due_ms": result.when_ms}


@app.get("/reminders/{reminder_id}")
async def show(reminder_id: str) -> dict[str, Any]:
    info = await _scheduler().get(reminder_id)
    if info is None:
        raise HTTPException(404, "no such reminder (never scheduled, cancelled or sent)")
    return {"id": reminder_id, "state": info.state.name}


@app.patch("/reminders/{reminder_id}")
async def move(reminder_id: str, body: Move) -> dict[str, Any]:
    """Move a reminder that has not been sent yet."""
    if not await _scheduler().reschedule(reminder_id, delay=body.delay):
        raise HTTPException(409, "not movable (unknown, running, or sent)")
    return {"id": reminder_id, "moved": True}


@app.delete("/reminders/{reminder_id}", status_code=204)
async def cancel(reminder_id: str) -> None:
    if not await _scheduler().cancel(reminder_id):
        raise HTTPException(404, "no such reminder")
