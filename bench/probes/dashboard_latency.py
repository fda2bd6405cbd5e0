"""Dashboard page latency with many pending jobs (not a test: it never asserts on speed).

Fills a private redis-server with ``--jobs`` pending jobs (default 10^6) over 16 shards
(``Scheduler.schedule_many`` in batches of 50,000), serves the dashboard with uvicorn in
a thread, and times over HTTP (httpx, one keep-alive connection, ``--repeats`` requests
each, in turn):

* the overview page (``/``) and its JSON (``/api/overview``): one pipeline of
  inspect.lua over the shards plus two commands for the workers, plus the view per
  task (the head of each shard's scheduled list and dead letters, two calls a shard);
* the internals page (``/internals``): the overview without the view per task;
* a lookup by id (``/job?id=...``, ``/api/job?id=...``) of a random pending job: one
  pipeline of get.lua and now.lua to the id's shard (one round trip).

Beside each, in the same run, the peer: the library calls an operator's script would
make itself (``Scheduler.inspect()``, the one-call-per-shard loop ``tickwheel inspect``
runs; ``Scheduler.get()``), timed on their own client. Reported: medians and p90 in ms.

    .venv/bin/python -m bench.probes.dashboard_latency [--jobs 1000000] [--repeats 50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable

import httpx
import uvicorn

from tickwheel.durable import JobSpec, Scheduler
from tickwheel.durable.ops.dashboard import DashboardConfig, create_app
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

SHARDS = 16
BATCH = 50_000


def _ms(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=10)
    return f"median {statistics.median(samples) * 1000:7.2f} ms, p90 {q[-1] * 1000:7.2f} ms"


async def _fill(url: str, ns: str, jobs: int) -> float:
    client = client_from_url(url)
    sched = Scheduler(client, ns, shards=SHARDS, check=False)
    started = time.perf_counter()
    for start in range(0, jobs, BATCH):
        await sched.schedule_many(
            JobSpec(f"job:{i}", "send_email", {"to": i}, delay=60 + i % 86_400)
            for i in range(start, min(start + BATCH, jobs))
        )
    took = time.perf_counter() - started
    await client.aclose()
    return took


async def _time_calls(
    url: str, ns: str, repeats: int, ids: list[str]
) -> tuple[list[float], list[float]]:
    client = client_from_url(url)
    sched = Scheduler(client, ns, shards=SHARDS, check=False)
    await sched.open()

    async def timed(fn: Callable[[], Awaitable[object]]) -> float:
        t = time.perf_counter()
        await fn()
        return time.perf_counter() - t

    inspect = [await timed(sched.inspect) for _ in range(repeats)]
    get = [await timed(lambda i=i: sched.get(i)) for i in ids]  # type: ignore[misc]
    await client.aclose()
    return inspect, get


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    ns = "bench"
    with RedisServer() as server:
        took = asyncio.run(_fill(server.url, ns, args.jobs))
        print(f"scheduled {args.jobs} jobs over {SHARDS} shards in {took:.1f} s", flush=True)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        port = sock.getsockname()[1]
        app = create_app(DashboardConfig(server.url, ns, sample_interval=5.0))
        srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        while not srv.started:
            time.sleep(0.01)
        rng = random.Random(1)
        ids = [f"job:{rng.randrange(args.jobs)}" for _ in range(args.repeats)]
        results: dict[str, list[float]] = {}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            for _ in range(3):  # warm: connection, scripts, templates
                http.get("/").raise_for_status()
                http.get("/api/job", params={"id": ids[0]}).raise_for_status()
            for name, path, params in (
                ("overview page /", "/", None),
                ("overview JSON /api/overview", "/api/overview", None),
                ("internals page /internals", "/internals", None),
                ("scheduled, every shard /scheduled", "/scheduled", None),
            ):
                samples = []
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    r = http.get(path, params=params)
                    samples.append(time.perf_counter() - t)
                    r.raise_for_status()
                results[name] = samples
            for name, path in (("lookup page /job", "/job"), ("lookup JSON /api/job", "/api/job")):
                samples = []
                for job_id in ids:
                    t = time.perf_counter()
                    r = http.get(path, params={"id": job_id})
                    samples.append(time.perf_counter() - t)
                    r.raise_for_status()
                results[name] = samples
        inspect, get = asyncio.run(_time_calls(server.url, ns, args.repeats, ids))
        results["peer: Scheduler.inspect() (16 calls)"] = inspect
        results["peer: Scheduler.get()"] = get
        srv.should_exit = True
        thread.join(10)
        sock.close()
    print(f"{args.jobs} pending jobs, {SHARDS} shards, {args.repeats} requests each:")
    for name, samples in results.items():
        print(f"  {name:<40} {_ms(samples)}")
    over = statistics.median(results["overview page /"])
    look = statistics.median(results["lookup page /job"])
    print(
        f"  overview page / Scheduler.inspect(): "
        f"{over / statistics.median(inspect):.2f}x; lookup page / Scheduler.get(): "
        f"{look / statistics.median(get):.2f}x"
    )


if __name__ == "__main__":
    main()
