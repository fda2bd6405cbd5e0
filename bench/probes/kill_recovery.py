"""Recovery after a worker is SIGKILLed (issue 40): ``python -m bench.probes.kill_recovery``.

Two figures, each against a baseline run in the same invocation, on a private
redis-server, with real ``tickwheel worker`` processes (the tests' ``recovery_support``
registry):

- *unstarted*: a worker runs one slow job in its only slot and holds three more claimed
  but not started; it is SIGKILLed and another worker (another id) starts at once.
  Measured: seconds from the kill to each of the three jobs' start in the new worker,
  and their attempt. The defaults (lookahead 1 s, start margin 5 s, owner TTL 5 s)
  against the timings before issue 40 (a claim leased lookahead + 30 s outright, owner
  TTL 10 s: ``--start-margin 30 --owner-ttl 10``).
- *takeover*: a worker owning 4 shards is SIGKILLed; seconds until every shard's epoch
  moved on (a new owner took it): restarted in place with the same ``--worker-id``,
  another worker with the default owner TTL (5 s), and the TTL before issue 40 (10 s).

Prints one line per repeat and the medians (and ratios to the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2] / "tests"
sys.path.insert(0, str(TESTS))

from recovery_support import runs  # noqa: E402
from spill_support import WorkerProcess  # noqa: E402

from tickwheel.durable import Scheduler  # noqa: E402
from tickwheel.durable.servers import RedisServer  # noqa: E402
from tickwheel.durable.store import Keys  # noqa: E402
from tickwheel.durable.store._connect import client_from_url  # noqa: E402

REGISTRY = "recovery_support:registry"
OLD_TIMINGS = ["--start-margin", "30", "--owner-ttl", "10"]  # before issue 40


async def _until(predicate: Callable[[], Awaitable[bool]], within: float = 120) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"not within {within} s")


async def unstarted(url: str, ns: str, extra: list[str]) -> tuple[list[float], list[int]]:
    """Seconds from the kill to each unstarted job's start elsewhere; their attempts."""
    options = ["--shards", "1", "--reap-interval", "0.2", *extra]
    # One slot in the victim (the slow job holds it); four in the survivor, so the slow
    # job, back at its lease's end, does not hold the others up.
    a = WorkerProcess(
        url, ns, *options, "--max-running", "1", "--worker-id", "a", registry=REGISTRY
    )
    b = None
    client = client_from_url(url)
    s = Scheduler(client, ns, shards=1, check=False)
    try:
        a.wait_started()
        await s.schedule("slow", "record", {"sink": ns, "sleep": 600}, delay=0.3)
        for i in range(3):
            await s.schedule(f"q{i}", "record", {"sink": ns}, delay=0.6)

        async def started() -> bool:
            return bool(await runs(client, ns))

        await _until(started)
        await asyncio.sleep(0.5)
        a.kill()
        sec, usec = await client.time()
        killed_ms = int(sec) * 1000 + int(usec) / 1000
        b = WorkerProcess(
            url, ns, *options, "--max-running", "4", "--worker-id", "b", registry=REGISTRY
        )
        b.wait_started()

        async def all_ran() -> bool:
            return len(await runs(client, ns)) >= 4

        await _until(all_ran)
        done = await runs(client, ns)
        later = [r for r in done if r[0] != "slow"]
        return [(r[3] - killed_ms) / 1000 for r in later], [r[1] for r in later]
    finally:
        for w in (a, b):
            if w is not None and w.proc.poll() is None:
                w.kill()
        await client.aclose()


async def takeover(url: str, ns: str, same_id: bool, ttl: float) -> float:
    """Seconds from the kill of a 4-shard owner to every epoch moved on."""
    shards = 4
    keys = Keys(ns, shards)
    options = ["--shards", str(shards), "--owner-ttl", str(ttl)]
    client = client_from_url(url)

    async def state() -> tuple[list[bytes | None], list[int]]:
        owners = [await client.get(keys.shard(i).owner) for i in range(shards)]
        epochs = [int(await client.get(keys.shard(i).epoch) or 0) for i in range(shards)]
        return owners, epochs

    a = WorkerProcess(url, ns, *options, "--worker-id", "w1", registry=REGISTRY)
    b = None
    try:
        a.wait_started()

        async def owned() -> bool:
            return (await state())[0] == [b"w1"] * shards

        await _until(owned)
        before = (await state())[1]
        a.kill()
        killed = time.monotonic()
        b = WorkerProcess(
            url, ns, *options, "--worker-id", "w1" if same_id else "w2", registry=REGISTRY
        )

        async def moved() -> bool:
            return all(e > o for e, o in zip((await state())[1], before, strict=True))

        await _until(moved)
        return time.monotonic() - killed
    finally:
        for w in (a, b):
            if w is not None and w.proc.poll() is None:
                w.kill()
        await client.aclose()


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def main(repeats: int) -> None:
    with RedisServer() as server:
        url = server.url
        os.environ["TICKWHEEL_TEST_SINK_URL"] = url
        n = 0

        def ns() -> str:
            nonlocal n
            n += 1
            return f"probe{n}"

        new, old = [], []
        for r in range(repeats):
            t_new, att_new = await unstarted(url, ns(), [])
            t_old, att_old = await unstarted(
                url, ns(), ["--start-margin", "30", "--owner-ttl", "10"]
            )
            print(flush=True, end="")
            print(f"unstarted #{r}: now {t_new} attempts {att_new}; before {t_old} {att_old}")
            new += t_new
            old += t_old
        print(
            f"unstarted median: now {_median(new):.2f} s, before-timings {_median(old):.2f} s,"
            f" ratio {_median(new) / _median(old):.2f}"
        )
        same, other, old_ttl = [], [], []
        for r in range(repeats):
            same.append(await takeover(url, ns(), True, 5.0))
            other.append(await takeover(url, ns(), False, 5.0))
            old_ttl.append(await takeover(url, ns(), False, 10.0))
            print(f"takeover #{r}: same id {same[-1]:.2f}, other {other[-1]:.2f}", end="")
            print(f", TTL 10 s {old_ttl[-1]:.2f}")
        base = _median(old_ttl)
        print(
            f"takeover median: same id {_median(same):.2f} s ({_median(same) / base:.2f}),"
            f" other worker {_median(other):.2f} s ({_median(other) / base:.2f}),"
            f" TTL 10 s before {base:.2f} s"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    asyncio.run(main(parser.parse_args().repeats))
