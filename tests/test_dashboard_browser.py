"""The dashboard's pages in a real browser: Playwright driving the system's Chromium
against uvicorn serving the app, on a real Redis and a real Redis Cluster.

Screenshots go to ``$TICKWHEEL_ARTIFACTS`` (or the test's tmp_path); each test prints
where it saved them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from dashboard_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    LiveDashboard,
    WorkerThread,
    artifacts_dir,
    config,
    wait_for,
)
from durable_support import open_scheduler, unique_ns
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tickwheel.durable import JobSpec, JobState, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer, free_port

pytestmark = pytest.mark.redis

SHARDS = 4
T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a loop of its own thread (Playwright's sync API holds this
    thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Chromium at {CHROMIUM}: on Debian or Ubuntu, "
            "apt-get install chromium (.ci/run does), or set TICKWHEEL_CHROMIUM"
        )
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def shot(page: Page, tmp_path: Path, name: str) -> Path:
    where = artifacts_dir(tmp_path) / f"{name}.png"
    page.screenshot(path=str(where), full_page=True)
    print(f"screenshot: {where}")
    return where


async def schedule(url: str, ns: str, specs: list[JobSpec]) -> None:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many(specs)


async def kill(url: str, ns: str, jobs: dict[str, tuple[str, str]]) -> None:
    """Dead letters: id -> (task, error)."""
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        await sched.schedule_many([JobSpec(i, t, {"id": i}) for i, (t, _) in jobs.items()])
        for shard in {sched.keys.shard_of(i) for i in jobs}:
            await sched.take(shard)
            for job in (await sched.claim(shard, limit=1000)).jobs:
                assert await sched.retry(job, jobs[job.id][1], final=True) is JobState.DEAD
        await sched.close()


async def state_of(url: str, ns: str, job_id: str) -> str | None:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        info = await sched.get(job_id)
        return None if info is None else info.state.name.lower()


def log_in(page: Page) -> None:
    page.click("#login")
    page.fill("input[name=token]", TOKEN)
    page.click("text=Log in >> nth=-1")
    expect(page.locator("button", has_text="Log out")).to_be_visible()


def test_overview_counts_change_as_a_worker_runs_jobs(
    browser: Browser, redis_url: str, tmp_path: Path
) -> None:
    ns = unique_ns()
    reg = TaskRegistry()

    @reg.task(name="email")
    async def email(ctx: Any) -> None:
        await asyncio.sleep(0.01)

    run(schedule(redis_url, ns, [JobSpec(f"now{i}", "email", {"to": i}) for i in range(30)]))
    run(schedule(redis_url, ns, [JobSpec(f"later{i}", "email", delay=3600) for i in range(5)]))
    with LiveDashboard(config(redis_url, ns)) as live:
        page = browser.new_page(base_url=live.url)
        page.goto("/")
        expect(page.locator("#total-due")).to_have_text("35")
        expect(page.locator("#total-overdue")).to_have_text("30")
        expect(page.locator("#total-workers")).to_have_text("0")
        expect(page.locator("#tasks tr[data-task=email] td[data-c=overdue]")).to_have_text("30")
        with WorkerThread(redis_url, ns, reg):
            # The page refreshes itself: no reload.
            expect(page.locator("#total-due")).to_have_text("5", timeout=30_000)
            expect(page.locator("#total-workers")).to_have_text("1", timeout=30_000)
            expect(page.locator("#total-owned")).to_have_text(f"{SHARDS}/{SHARDS}")
            expect(page.locator("#total-overdue")).to_have_text("0")
            expect(page.locator("#tasks tr[data-task=email] td[data-c=overdue]")).to_have_text("0")
            expect(page.locator("[data-last=acked]")).not_to_have_text("-", timeout=30_000)
            expect(page.locator("#total-acks")).not_to_have_text("-", timeout=30_000)
            shot(page, tmp_path, f"overview-{'cluster' if 'cluster' in redis_url else 'redis'}")
            # The worker's published counters reach the internals page within a few beats.
            page.click("header a[href='/internals']")
            acked = page.locator("#workers td[data-c=acked]")
            expect(acked).to_have_text("30", timeout=30_000)
            shot(page, tmp_path, f"internals-{'cluster' if 'cluster' in redis_url else 'redis'}")
        page.close()


def test_look_up_a_job_and_cancel_it(browser: Browser, redis_url: str, tmp_path: Path) -> None:
    ns = unique_ns()
    run(schedule(redis_url, ns, [JobSpec("invoice:42", "charge", {"cents": 1999}, delay=600)]))
    with LiveDashboard(config(redis_url, ns)) as live:
        page = browser.new_page(base_url=live.url)
        page.goto("/")
        page.fill("header input[name=id]", "invoice:42")
        page.click("header button")
        expect(page.locator("#job-state")).to_have_text("due")
        expect(page.locator("#job-task")).to_have_text("charge")
        expect(page.locator("#job-payload")).to_have_text('{"cents": 1999}')
        expect(page.locator("#cancel")).to_have_count(0)  # not logged in: no actions
        log_in(page)
        expect(page.locator("#job-id")).to_have_text("invoice:42")  # back on the job
        shot(page, tmp_path, "job")
        page.click("#cancel")
        expect(page.locator("#message")).to_contain_text("cancelled job 'invoice:42'")
        assert run(state_of(redis_url, ns, "invoice:42")) is None
        page.goto("/job?id=invoice:42")
        expect(page.locator("#message")).to_contain_text("no job 'invoice:42'")
        page.fill("#lookup-id", "x" * 300)
        page.click("main button")
        expect(page.locator("#message")).to_contain_text("job_id must be at most 256")
        page.close()


def test_a_write_without_the_token_is_refused(browser: Browser, redis_url: str) -> None:
    ns = unique_ns()
    run(schedule(redis_url, ns, [JobSpec("keep", "t", delay=600)]))
    with LiveDashboard(config(redis_url, ns)) as live:
        context = browser.new_context(base_url=live.url)
        page = context.new_page()
        page.goto("/job?id=keep")
        log_in(page)
        expect(page.locator("#cancel")).to_be_visible()
        context.clear_cookies()  # the session is gone; the form is still on the page
        page.click("#cancel")
        expect(page.locator("#message")).to_contain_text("needs the dashboard token")
        # A script of the page without the token: refused as well.
        status = page.evaluate(
            """() => fetch('/api/job/cancel', {method: 'POST',
                headers: {'Content-Type': 'application/json'},
                body: JSON.stringify({id: 'keep'})}).then(r => r.status)"""
        )
        assert status == 401
        assert run(state_of(redis_url, ns, "keep")) == "due"
        context.close()


def test_requeue_and_purge_dead_letters(browser: Browser, redis_url: str, tmp_path: Path) -> None:
    ns = unique_ns()
    run(
        kill(
            redis_url,
            ns,
            {
                "pay:1": ("charge", "CardDeclined: insufficient funds"),
                "pay:2": ("charge", "CardDeclined: expired"),
                "mail:1": ("email", "SMTP 550 mailbox unavailable"),
                "mail:2": ("email", "SMTP 550 mailbox unavailable"),
            },
        )
    )
    with LiveDashboard(config(redis_url, ns)) as live:
        page = browser.new_page(base_url=live.url)
        page.goto("/dead")
        expect(page.locator("#dead-summary")).to_contain_text("4 dead letters")
        log_in(page)
        shot(page, tmp_path, "dead-letters")
        page.check("input[name=ids][value='pay:1']")
        page.click("#requeue-selected")
        expect(page.locator("#message")).to_contain_text("requeued 1 dead letter")
        assert run(state_of(redis_url, ns, "pay:1")) == "due"
        page.goto("/dead")
        page.check("input[name=ids][value='pay:2']")
        page.click("#purge-selected")
        expect(page.locator("#message")).to_contain_text("purged 1 dead letter")
        assert run(state_of(redis_url, ns, "pay:2")) is None
        # In bulk over a filter: every dead letter whose reason mentions SMTP 550.
        page.goto("/dead")
        page.fill("#filter input[name=reason]", "smtp 550")
        page.click("#filter button")
        expect(page.locator("#dead tr")).to_have_count(3)  # the header and two rows
        page.click("#bulk-purge")
        expect(page.locator("#message")).to_contain_text("purged 2 dead letter")
        assert run(state_of(redis_url, ns, "mail:1")) is None
        assert run(state_of(redis_url, ns, "mail:2")) is None
        page.goto("/dead")
        expect(page.locator("#dead-summary")).to_contain_text("0 dead letters")
        page.close()


def test_an_xss_payload_stays_text(browser: Browser, redis_url: str, tmp_path: Path) -> None:
    ns = unique_ns()
    evil = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
    run(schedule(redis_url, ns, [JobSpec("xss" + evil, evil, {"html": evil}, delay=600)]))
    run(kill(redis_url, ns, {"dead-xss": ("t", evil)}))
    with LiveDashboard(config(redis_url, ns)) as live:
        page = browser.new_page(base_url=live.url)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto("/job?id=" + page.evaluate("encodeURIComponent", "xss" + evil))
        expect(page.locator("#job-task")).to_have_text(evil)
        expect(page.locator("#job-payload")).to_contain_text("<script>window.__xss = 1</script>")
        shot(page, tmp_path, "xss")
        page.goto("/dead")
        expect(page.locator("#dead")).to_contain_text(evil)
        page.goto("/scheduled?shard=" + str(_shard(ns, "xss" + evil)))
        expect(page.locator("#jobs")).to_contain_text("xss<script>")
        assert page.evaluate("window.__xss") is None
        for path in ("/", "/internals", "/scheduled"):  # the first screen, the new pages
            page.goto(path)
            page.wait_for_timeout(300)  # a refresh of the live part
            assert page.evaluate("window.__xss") is None, path
            assert page.locator("main img").count() == 0, path
        expect(page.locator("#jobs")).to_contain_text("xss<script>")
        assert page.locator("#job-payload img, #dead img, #jobs img").count() == 0
        assert dialogs == []
        page.close()


def _shard(ns: str, job_id: str) -> int:
    from tickwheel.durable.store._keys import Keys

    return Keys(ns, SHARDS).shard_of(job_id)


def test_read_only_mode(browser: Browser, redis_url: str) -> None:
    ns = unique_ns()
    run(schedule(redis_url, ns, [JobSpec("ro", "t", delay=600)]))
    run(kill(redis_url, ns, {"ro-dead": ("t", "boom")}))
    with LiveDashboard(config(redis_url, ns, read_only=True)) as live:
        page = browser.new_page(base_url=live.url)
        page.goto("/job?id=ro")
        expect(page.locator("#mode")).to_have_text("read-only")
        expect(page.locator("main")).to_contain_text("Read-only dashboard: actions are off")
        expect(page.locator("#cancel")).to_have_count(0)
        page.goto("/dead")
        expect(page.locator("#requeue-selected")).to_have_count(0)
        expect(page.locator("#bulk")).to_have_count(0)
        status = page.evaluate(
            """(token) => fetch('/api/dead/purge', {method: 'POST',
                headers: {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + token},
                body: JSON.stringify({ids: ['ro-dead']})}).then(r => r.status)""",
            TOKEN,
        )
        assert status == 403
        assert run(state_of(redis_url, ns, "ro-dead")) == "dead"
        page.close()


def test_redis_down_is_said_and_the_page_recovers(browser: Browser, tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://admin:pw-secret-1@127.0.0.1:{port}/0"
    ns = unique_ns()
    with LiveDashboard(config(url, ns)) as live:
        page = browser.new_page(base_url=live.url)
        page.goto("/")
        expect(page.locator("#redis-error")).to_contain_text("Redis is unreachable")
        assert "pw-secret-1" not in page.content()
        shot(page, tmp_path, "redis-down")
        acl = ["--user", "admin", "on", ">pw-secret-1", "~*", "&*", "+@all"]
        with RedisServer(port=port, extra_args=acl):
            run(schedule(url, ns, [JobSpec("j", "t", delay=600)]))
            expect(page.locator("#total-due")).to_have_text("1", timeout=30_000)
            expect(page.locator("#redis-error")).to_have_count(0)
        expect(page.locator("#redis-error")).to_be_visible(timeout=30_000)
        assert "pw-secret-1" not in page.content()
        page.close()


def test_the_first_screen_per_task_with_human_times(
    browser: Browser, redis_url: str, tmp_path: Path
) -> None:
    ns = unique_ns()
    run(
        kill(
            redis_url,
            ns,
            {"pay:1": ("charge_card", "CardDeclined: expired"), "pay:2": ("charge_card", "x")},
        )
    )
    run(schedule(redis_url, ns, [JobSpec(f"mail:{i}", "send_email") for i in range(12)]))
    specs = [JobSpec(f"report:{i}", "nightly_report", delay=3 * 3600 + 720) for i in range(3)]
    run(schedule(redis_url, ns, specs))
    with LiveDashboard(config(redis_url, ns)) as live:
        page = browser.new_page(base_url=live.url, viewport={"width": 1280, "height": 800})
        page.goto("/")
        tasks = page.locator("#tasks tr[data-task]")
        expect(tasks).to_have_count(3)
        expect(tasks.first).to_have_attribute("data-task", "charge_card")  # dead first
        card = page.locator("#tasks tr[data-task=charge_card] td[data-c=dead]")
        expect(card).to_have_text("2")
        email = page.locator("#tasks tr[data-task=send_email]")
        expect(email.locator("td[data-c=overdue]")).to_have_text("12")
        nxt = page.locator("#tasks tr[data-task=nightly_report] td[data-c=next] time")
        expect(nxt).to_have_text(re.compile(r"^in 3 h 1[12] min$"))
        expect(nxt).to_have_attribute("title", re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:.* UTC$"))
        expect(page.locator("#shards")).to_have_count(0)
        shot(page, tmp_path, "first-screen")
        # From a task to its scheduled jobs, merged across shards in due order.
        page.click("#tasks tr[data-task=send_email] a")
        expect(page.locator("#jobs tr")).to_have_count(13)  # the header and 12 rows
        expect(page.locator("#scheduled-summary")).to_contain_text("filtered")
        shot(page, tmp_path, "scheduled-all")
        page.close()


def test_throughput_per_task_history_and_attempts_in_the_browser(
    browser: Browser, redis_url: str, tmp_path: Path
) -> None:
    """A worker keeping a history runs jobs (one dead-lettered with a hostile id and
    error): the first screen shows done/min per task, the history page filters by
    outcome through its form, and its link leads to the job's attempts, all as text."""
    ns = unique_ns()
    evil = '<img src=x onerror="window.__xss = 3">'
    reg = TaskRegistry()

    @reg.task(name="send")
    async def send(ctx: Any) -> None:
        pass

    @reg.task(name="charge")
    async def charge(ctx: Any) -> None:
        raise RuntimeError(f"declined {evil}")

    specs = [JobSpec(f"s{i}", "send") for i in range(20)]
    specs.append(JobSpec("bad" + evil, "charge", max_attempts=1))
    with (
        LiveDashboard(config(redis_url, ns)) as live,
        WorkerThread(redis_url, ns, reg, shards=SHARDS, history=True),
    ):
        run(schedule(redis_url, ns, specs))
        page = browser.new_page(base_url=live.url)
        page.goto("/")
        rate = page.locator('#tasks tr[data-task="send"] td[data-c="rate"]')
        expect(rate).not_to_have_text("-", timeout=20_000)  # from the workers' samples
        expect(page.locator('#tasks tr[data-task="charge"] td[data-c="failed"]')).to_have_text(
            "1", timeout=20_000
        )
        shot(page, tmp_path, "tasks-throughput")
        page.goto("/history")
        expect(page.locator("#history")).to_contain_text("s19", timeout=10_000)
        page.select_option("select[name=outcome]", "dead")
        page.locator("#filter button").click()
        expect(page.locator("#history tr[data-outcome]")).to_have_count(1)
        expect(page.locator("#history")).to_contain_text(f"declined {evil}")
        shot(page, tmp_path, "history-dead")
        page.locator("#history a", has_text="bad").click()
        expect(page.locator("#attempts")).to_contain_text("dead")
        expect(page.locator("#attempts")).to_contain_text(f"declined {evil}")
        shot(page, tmp_path, "job-attempts")
        assert page.evaluate("window.__xss") is None
        assert page.locator("main img").count() == 0
        page.close()


async def _key_counts(url: str, ns: str, task: str, key: str) -> tuple[int, int]:
    async with open_scheduler(url, ns, shards=SHARDS) as sched:
        state = await sched.key_state(task, key)
        return state.running, state.waiting


def test_a_flow_key_from_a_job_page_and_the_lookup_form(
    browser: Browser, redis_url: str, tmp_path: Path
) -> None:
    """A worker runs a ``concurrency=1`` task; the first run of a key (with markup in
    it) holds the permit and the other two wait. A job page's flow key link opens the
    key page: 1 running, 2 waiting, its limit, the key as text. The lookup form finds
    another key (nothing there) and names a bad key's problem; once the run ends, the
    key page shows the key drained."""
    ns = unique_ns()
    reg = TaskRegistry()
    gate = threading.Event()

    @reg.task(name="charge", concurrency=1)
    async def charge(ctx: Any) -> None:
        while not gate.is_set():  # noqa: ASYNC110 (a thread's event)
            await asyncio.sleep(0.02)

    key = 'm:<b id="evil">42</b> & co'
    run(schedule(redis_url, ns, [JobSpec(f"c{i}", "charge", key=key) for i in range(3)]))
    with (
        LiveDashboard(config(redis_url, ns)) as live,
        WorkerThread(redis_url, ns, reg, shards=SHARDS),
    ):

        def counts() -> tuple[int, int]:
            return run(_key_counts(redis_url, ns, "charge", key))

        try:
            assert wait_for(lambda: counts() == (1, 2), 30), counts()
            page = browser.new_page(base_url=live.url)
            page.goto("/job?id=c2")
            page.click("#job-key a")
            expect(page).to_have_url(re.compile(r"/key\?task=charge&key=m%3A%3Cb"))
            expect(page.locator("#key-name")).to_have_text(key)
            expect(page.locator("#evil")).to_have_count(0)  # text, not markup
            expect(page.locator("#key-limits")).to_have_text("concurrency 1")
            expect(page.locator("#key-running")).to_have_text("1")
            expect(page.locator("#key-waiting")).to_have_text("2")
            shot(page, tmp_path, "flow-key")
            page.fill("#key-key", "merchant:7")
            page.click("main form button")
            expect(page.locator("#key-name")).to_have_text("merchant:7")
            expect(page.locator("#key-running")).to_have_text("0")
            expect(page.locator("#key-waiting")).to_have_text("0")
            page.fill("#key-key", "k" * 201)
            page.click("main form button")
            expect(page.locator("#message")).to_contain_text("key")
            expect(page.locator("#key")).to_have_count(0)  # no row for a refused key
        finally:
            gate.set()
        assert wait_for(lambda: counts() == (0, 0), 30), counts()
        page.goto("/key?task=charge&key=" + page.evaluate("encodeURIComponent", key))
        expect(page.locator("#key-running")).to_have_text("0")
        expect(page.locator("#key-waiting")).to_have_text("0")
        page.close()
