"""Debounce and throttle by job id on the producer side: one flow.lua call per schedule
(the asyncio and the synchronous schedulers both come here for their checks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tickwheel.durable.model import JobSpec, ScheduleResult
from tickwheel.durable.store import encode_job

if TYPE_CHECKING:
    from ._producer import Producer

__all__ = ["check_flow_mode", "schedule_flow"]


def check_flow_mode(spec: JobSpec, postgres: bool, many: bool = False) -> None:
    """Refuse a debounced or throttled spec where flow.lua cannot take it.

    Raises:
        ValueError: in the Postgres mode (not supported yet), or in a batch.
    """
    if not spec.flow[0]:
        return
    name = "debounce" if spec.flow[0] == "d" else "throttle"
    if postgres:
        raise ValueError(f"{name} is not in the Postgres mode yet")
    if many:
        raise ValueError(f"{name}: schedule such a job with schedule(), not in a batch")


async def schedule_flow(producer: Producer, spec: JobSpec) -> ScheduleResult:
    """One debounced or throttled schedule (flow.lua).

    Raises:
        ValueError: as :func:`check_flow_mode` (nothing written).
    """
    check_flow_mode(spec, producer.pg is not None)
    encoded = encode_job(spec, producer.max_payload_bytes)
    await producer.opened()
    shard = producer.keys.shard_of(spec.id)
    return await producer.store.schedule_one(shard, encoded, False, spec.flow)
