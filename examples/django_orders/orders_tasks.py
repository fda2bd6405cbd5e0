"""The charge task, run by ``tickwheel worker orders_tasks:registry --postgres-url ...``.

A real shop would call its payment provider here, with the idempotency key
``(ctx.job_id, ctx.nominal_ms)``. The example appends a JSON line per run to
``$ORDERS_LOG`` (or prints it), which its test reads.
"""

from __future__ import annotations

import json
import os
import time
from typing import TypedDict

from tickwheel.durable import TaskContext, TaskRegistry

registry = TaskRegistry()


class Charge(TypedDict):
    order: str
    cents: int


@registry.task(name="orders.charge")
def charge(ctx: TaskContext, args: Charge) -> None:
    line = json.dumps(
        {
            "id": ctx.job_id,
            "nominal_ms": ctx.nominal_ms,
            "ran_ms": int(time.time() * 1000),
            "order": args["order"],
            "cents": args["cents"],
        }
    )
    path = os.environ.get("ORDERS_LOG")
    if path is None:
        print(line, flush=True)
        return
    with open(path, "a") as log:
        log.write(line + "\n")
