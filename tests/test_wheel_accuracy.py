"""Real-clock accuracy: the one test of the wheel against wall time.

Never early is asserted strictly. Lateness is bounded loosely here, since CI machines are
shared and a loop can be descheduled; bench/bench_wheel.py measures the percentiles.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import uvloop

from tickwheel.wheel import TimingWheel

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


@pytest.mark.parametrize("name", list(LOOPS))
def test_real_clock_accuracy(name: str) -> None:
    loop = LOOPS[name]()
    try:
        lateness = loop.run_until_complete(_measure(loop, count=2000))
    finally:
        loop.close()
    lateness.sort()
    assert lateness[0] >= 0.0, "a timer fired early"
    p50 = lateness[len(lateness) // 2]
    p99 = lateness[int(len(lateness) * 0.99)]
    # One tick (1 ms) plus loop latency; generous for a noisy shared machine.
    assert p50 <= 0.001 + 0.005, f"p50 lateness {p50 * 1e3:.2f} ms"
    assert p99 <= 0.001 + 0.050, f"p99 lateness {p99 * 1e3:.2f} ms"


async def _measure(loop: asyncio.AbstractEventLoop, count: int) -> list[float]:
    wheel = TimingWheel()
    rng = random.Random(3)
    lateness: list[float] = []
    done = loop.create_future()
    # Background load: far timers the wheel must hold without slowing the near ones.
    for _ in range(20_000):
        wheel.schedule(rng.uniform(60, 3600), lambda: None)

    def fire(when: float) -> None:
        lateness.append(loop.time() - when)
        if len(lateness) == count:
            done.set_result(None)

    for _ in range(count):
        delay = rng.uniform(0.0, 0.3)
        wheel.schedule(delay, fire, loop.time() + delay)
    await asyncio.wait_for(done, 30)
    wheel.close()
    return lateness
