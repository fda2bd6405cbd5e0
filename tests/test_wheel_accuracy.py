"""Real-clock accuracy: the one test of the wheel against wall time.

Never early is asserted strictly. Lateness is bounded only loosely here (2 s), since CI
machines are shared and a loop can be descheduled; ``python -m bench`` measures the
percentiles.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
import uvloop

from tickwheel.wheel import TimingWheel

# Every test here runs on both implementations (tests/wheel_impls.py).
pytestmark = pytest.mark.usefixtures("wheel_impl")

# Seconds any timer may be late on a loaded machine (see the test).
MAX_LATE = 2.0

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
    assert len(lateness) == 2000, "every timer fired"
    assert lateness[0] >= 0.0, "a timer fired early"
    # Behaviour, not speed: percentiles belong in bench/ (a p99 bound of 50 ms failed
    # on a CI machine that was busy with other work, at 94 ms). What must hold on any
    # machine is that nothing waits for a far timer's slot or a cascade that never
    # comes: a loaded 2-core machine deschedules a process for well under 2 s.
    assert lateness[-1] <= MAX_LATE, f"max lateness {lateness[-1] * 1e3:.1f} ms"


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
