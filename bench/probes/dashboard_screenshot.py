"""Make the README's dashboard screenshot (docs/dashboard-overview.png): a private
redis-server, 16 shards, two workers running a steady stream of jobs (some fail and
retry, a few end as dead letters), the dashboard sampling every second, and the system's
Chromium (Playwright) taking the picture after ``--seconds``. With ``--pages``, also
the history page and the job page of a job that was retried (``<out>-history.png``,
``<out>-job.png``; the workers keep a history).

    .venv/bin/python -m bench.probes.dashboard_screenshot [--seconds 60] [--out FILE.png]
        [--pages]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tickwheel.durable import JobSpec, Scheduler, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store._connect import client_from_url

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from dashboard_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    LiveDashboard,
    WorkerThread,
    config,
)

NS = "shop"
SHARDS = 16


def registry() -> TaskRegistry:
    reg = TaskRegistry()
    rng = random.Random(7)

    @reg.task(name="send_email")
    async def send_email(ctx: Any) -> None:
        await asyncio.sleep(rng.uniform(0.001, 0.01))

    @reg.task(name="charge_card")
    async def charge_card(ctx: Any) -> None:
        if rng.random() < 0.1:
            raise RuntimeError("CardDeclined: insufficient funds")

    return reg


async def feed(url: str, stop: threading.Event) -> None:
    client = client_from_url(url)
    sched = Scheduler(client, NS, shards=SHARDS, check=False, retry_base=0.5, retry_max=2)
    await sched.schedule("report:nightly", "send_email", cron="0 3 * * *", missed="skip")
    await sched.schedule("sync:inventory", "send_email", every=300)
    await sched.schedule_many(
        JobSpec(f"later:{i}", "send_email", delay=600 + i) for i in range(5000)
    )
    n = 0
    while not stop.is_set():
        specs = [
            JobSpec(f"mail:{n + i}", "send_email", {"to": f"user{n + i}@example.org"})
            for i in range(150)
        ]
        specs += [
            JobSpec(f"pay:{n + i}", "charge_card", {"cents": 100 + i}, max_attempts=2, delay=1)
            for i in range(40)
        ]
        await sched.schedule_many(specs)
        n += 200
        await asyncio.sleep(1.0)
    await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default="docs/dashboard-overview.png")
    parser.add_argument("--pages", action="store_true")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with RedisServer() as server:
        stop = threading.Event()
        feeder = threading.Thread(target=asyncio.run, args=(feed(server.url, stop),))
        feeder.start()
        time.sleep(1)
        reg = registry()
        with (
            LiveDashboard(config(server.url, NS, sample_interval=1.0)) as live,
            WorkerThread(server.url, NS, reg, shards=SHARDS, history=True),
            WorkerThread(server.url, NS, reg, shards=SHARDS, history=True),
        ):
            time.sleep(args.seconds)  # the load goes on while the picture is taken
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(base_url=live.url, viewport={"width": 1280, "height": 900})
                page.goto("/")
                page.wait_for_timeout(3000)  # one refresh of the counts and the charts
                page.screenshot(path=args.out, full_page=True)
                if args.pages:
                    stem = args.out.removesuffix(".png")
                    page.goto("/history")
                    page.screenshot(path=f"{stem}-history.png", full_page=True)
                    retried = page.request.get("/api/history?outcome=retried").json()
                    first = retried["entries"][0]["id"] if retried["entries"] else "pay:1"
                    page.goto(f"/job?id={first}")
                    page.screenshot(path=f"{stem}-job.png", full_page=True)
                browser.close()
            stop.set()
            feeder.join()
    print(f"screenshot: {args.out}")


if __name__ == "__main__":
    main()
