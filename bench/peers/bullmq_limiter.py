"""BullMQ's Python port's global rate limiter, the peer of the flow limits' rate row
(bench/runner/limits.py): ``Worker(limiter={"max": n, "duration": ms})``.

It limits a whole queue: every job of the queue counts against one limiter. It cannot
limit per key (BullMQ's group limits are BullMQ Pro's, taskforcesh/bullmq #1322), so the
row runs one key on our side against one queue on its side.

**``drainDelay`` is set to 1 s, and why.** With the port's defaults (bullmq 3.4.4) and
redis-py 8, a rate-limited worker runs its first ``max`` jobs and then nothing for
minutes (the last session saw 10 of 40 jobs in 60 s). Two things meet:

1. When ``moveToActive`` answers "rate limited" it returns how long the limit holds
   (``limitUntil``). BullMQ for Node sleeps that long and asks again; the port stores
   it and never reads it, so the worker falls through to its idle wait: BZPOPMIN on the
   queue's marker for ``drainDelay`` (5 s by default), and no marker comes while the
   jobs sit in ``wait``.
2. redis-py 8 gives a client a 5 s socket timeout by default (``DEFAULT_SOCKET_TIMEOUT``),
   and the port builds its connections without one. A BZPOPMIN blocking 5 s meets a
   5 s read timeout: the read fails with ``TimeoutError`` just before Redis answers
   "nothing", and the port's connection retries timeouts itself (``Retry(
   ExponentialBackoff(cap=20, base=1), 20)``), each retry timing out again.

A ``drainDelay`` under the socket timeout fixes both for this row: the idle wait ends
after a second, and the worker asks again (so it starts a window's jobs up to a second
after the window opens, by its design, not a flaw of this setup).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

DRAIN_DELAY = 1  # s: under redis-py's 5 s socket timeout (see above)
TIMEOUT = 120.0  # s before the row gives up waiting for the jobs


def available() -> bool:
    try:
        import bullmq  # type: ignore[import-not-found, import-untyped]  # noqa: F401
    except ImportError:
        return False
    return True


async def bullmq_rate(url: str, n: int, limit: int, seconds: float) -> tuple[float, list[float]]:
    """``n`` jobs added at once to a queue whose worker has ``limiter={max: limit,
    duration: seconds}``: the epoch ms just before they were added, and the epoch ms
    of each start (all ``n`` unless :data:`TIMEOUT` passed first)."""
    from bullmq import Queue, Worker

    starts: list[float] = []

    async def job(j: Any, token: str) -> None:
        starts.append(time.time() * 1000)

    queue = Queue("limited", {"connection": url})
    opts = {
        "connection": url,
        "limiter": {"max": limit, "duration": int(seconds * 1000)},
        "drainDelay": DRAIN_DELAY,
        "autorun": False,
    }
    worker = Worker("limited", job, opts)
    # As bench/peers/queues.py does: let the port learn that BZPOPMIN takes fractions.
    await worker.blockingRedisConnection.getRedisVersion()
    task = asyncio.ensure_future(worker.run())
    try:
        await asyncio.sleep(0.3)  # as tickwheel's worker gets
        t0 = time.time() * 1000
        await queue.addBulk([{"name": "job", "data": {}, "opts": {}} for _ in range(n)])
        deadline = time.monotonic() + TIMEOUT
        while len(starts) < n and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
    finally:
        await worker.close()
        await asyncio.gather(task, return_exceptions=True)
        await queue.close()
    return t0, sorted(starts)
