"""What a worker logs (issue 40): each line at its level, with its fields, a traceback
where one belongs, the logger name once, outages once at their start and once at their
end, and the JSON format of ``tickwheel worker --log-format json``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.durable_support import open_scheduler, run, unique_ns
from tests.spill_support import SINK_ENV, TESTS_DIR, running_worker, until
from tickwheel.durable import TaskContext, TaskRegistry
from tickwheel.durable.model import split_error
from tickwheel.durable.runtime._logs import TRACEBACK_CHARS, failure_text
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis

LOGGER = "tickwheel.durable"
FAST = {"lookahead": 0.1, "poll_interval": 0.02, "reap_interval": 0.05}


def _records(caplog: pytest.LogCaptureFixture, needle: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and needle in r.getMessage()]


def test_failures_retries_and_dead_letters_are_logged_with_tracebacks(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    reg = TaskRegistry()

    @reg.task(name="refund")
    async def refund(ctx: TaskContext) -> None:
        raise ValueError(f"card declined (attempt {ctx.attempt})")

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1, retry_base=0) as s:
            await s.schedule("refund:2", "refund", {"amount": 3}, max_attempts=2)
            await s.schedule("ghost:1", "no.such.task")
            async with running_worker(s, reg, **FAST):
                assert await until(lambda: bool(_records(caplog, "'refund:2' dead")), 10)
                assert await until(lambda: bool(_records(caplog, "'ghost:1' dead")), 10)
            dead = {j.id: j for j in (await s.dead_letters(0)).jobs}
        # The retry: WARNING, the exception with its traceback, the job's fields.
        (retry,) = _records(caplog, "will retry")
        assert retry.levelno == logging.WARNING
        assert "job 'refund:2' (task refund) failed at attempt 1/2" in retry.getMessage()
        assert retry.exc_info is not None and isinstance(retry.exc_info[1], ValueError)
        assert (retry.job_id, retry.task, retry.attempt, retry.shard) == (
            "refund:2",
            "refund",
            1,
            0,
        )  # type: ignore[attr-defined]
        assert "in refund" in caplog.text and "ValueError: card declined (attempt 1)" in caplog.text
        # The dead letter: ERROR, once, with id, task, attempts, reason and traceback.
        (died,) = _records(caplog, "'refund:2' dead-lettered")
        assert died.levelno == logging.ERROR and died.exc_info is not None
        assert "(task refund, attempt 2/2): failed: ValueError" in died.getMessage()
        assert died.reason.startswith("failed: ValueError")  # type: ignore[attr-defined]
        (ghost,) = _records(caplog, "'ghost:1' dead-lettered")
        assert (
            ghost.levelno == logging.ERROR and "unknown task 'no.such.task'" in ghost.getMessage()
        )
        # The traceback is kept with the job's last error, read back by dead_letters/get.
        summary, trace = split_error(dead["refund:2"].last_error)
        assert summary == "ValueError('card declined (attempt 2)')"
        assert trace.startswith("Traceback (most recent call last):\n") and "in refund" in trace
        assert split_error(dead["ghost:1"].last_error) == ("unknown task 'no.such.task'", "")
        # No message repeats the logger's name.
        assert not [r for r in caplog.records if r.getMessage().startswith("tickwheel.")]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(main())


def test_the_kept_traceback_is_bounded_and_old_records_still_read() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("x" * 5000)
        deep(n - 1)

    try:
        deep(200)
    except RuntimeError as exc:
        text = failure_text(exc)
    summary, trace = split_error(text)
    assert len(summary) == 1024 and summary.endswith("...")
    assert len(trace) < TRACEBACK_CHARS + 200
    assert "characters cut ..." in trace and trace.rstrip().endswith("x" * 100)
    assert split_error("RuntimeError('old record')") == ("RuntimeError('old record')", "")


def test_each_job_is_logged_at_debug_claimed_started_acked(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    reg = TaskRegistry()
    ran: list[str] = []

    @reg.task(name="ping")
    def ping(ctx: TaskContext) -> None:
        ran.append(ctx.job_id)

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            await s.schedule("p1", "ping", delay=0.3)
            async with running_worker(s, reg, **FAST):
                assert await until(lambda: bool(_records(caplog, "'p1' acked")), 10)

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run(main())
    claimed, started, acked = (
        _records(caplog, f"'p1' {what}")[0] for what in ("claimed", "started", "acked")
    )
    for record in (claimed, started, acked):
        assert record.levelno == logging.DEBUG
        assert (record.job_id, record.task, record.attempt) == ("p1", "ping", 1)  # type: ignore[attr-defined]
    assert "ms late" in started.getMessage() and started.lateness_ms >= 0  # type: ignore[attr-defined]
    assert started.created <= acked.created and claimed.created <= started.created


def test_fencing_and_shard_moves_are_logged_once(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        ns = unique_ns()
        async with open_scheduler(redis_server.url, ns, shards=1, owner_ttl=0.6) as s:
            async with running_worker(s, TaskRegistry(), **FAST):
                assert await until(lambda: 0 in s.ownership.owned, 5)
                epoch = s.ownership.owned[0]
                # Another owner's epoch: the next renewal is refused, the shard dropped.
                assert await s.store.raise_epoch(0, epoch + 1)
                assert await until(lambda: bool(_records(caplog, "(fenced)")), 5)
                assert await until(lambda: len(_records(caplog, "took shard 0")) == 2, 5)
            assert _records(caplog, "gave shard(s) 0 back at shutdown")

    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(main())
    (fenced,) = _records(caplog, "(fenced)")
    assert fenced.levelno == logging.WARNING and fenced.shard == 0  # type: ignore[attr-defined]
    took = _records(caplog, "took shard 0")
    assert [r.levelno for r in took] == [logging.INFO] * 2
    assert len(_records(caplog, "gave shard(s) 0 back")) == 1


def test_an_outage_is_logged_once_when_it_starts_and_once_when_it_ends(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        url = private_redis.url
        async with (
            open_scheduler(url, shards=2, owner_ttl=5.0, call_timeout=0.2) as s,
            running_worker(s, TaskRegistry(), **FAST) as w,
        ):
            assert await until(lambda: len(s.ownership.owned) == 2, 5)
            private_redis.pause()  # SIGSTOP by pid: every call times out
            try:
                assert await until(lambda: bool(w.outages.ongoing), 5)
                await asyncio.sleep(2.0)
            finally:
                private_redis.resume()
            assert await until(lambda: not w.outages.ongoing, 10)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(main())
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert warnings[0].getMessage().startswith("Redis unreachable")
    (back,) = _records(caplog, "reachable again")
    assert back.levelno == logging.INFO
    assert back.failed_calls >= 3, back.getMessage()  # type: ignore[attr-defined]
    seconds = float(back.getMessage().split("after ")[1].split(" s")[0])
    assert 1.5 <= seconds < 15, back.getMessage()


def test_worker_log_format_json_writes_one_object_a_line(redis_server: RedisServer) -> None:
    ns = unique_ns()
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), **{SINK_ENV: redis_server.url})
    err = Path(f"/tmp/tw-json-{ns}.log")
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "tickwheel.durable.ops.cli", "worker",
                "spill_support:registry", "--redis-url", redis_server.url,
                "--namespace", ns, "--shards", "1", "--no-check", "--log-format", "json", "-v",
                "--poll-interval", "0.02", "--lookahead", "0.1",
            ],
            stdout=subprocess.PIPE, stderr=stderr, env=env, text=True,
        )  # fmt: skip
        try:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline())["event"] == "started"

            async def schedule() -> None:
                async with open_scheduler(redis_server.url, ns, shards=1, retry_base=0) as s:
                    await s.schedule("s1", "sink", {"sink": ns})
                    await s.schedule("bad", "no.such.task")

            run(schedule())
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and "dead-lettered" not in err.read_text():
                time.sleep(0.05)
            while time.monotonic() < deadline and "'s1' acked" not in err.read_text():
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=30)
    lines = err.read_text().splitlines()
    err.unlink()
    docs = [json.loads(line) for line in lines]  # every line is one JSON object
    for doc in docs:
        assert {"time", "level", "logger", "message"} <= set(doc), doc
        assert doc["logger"].startswith("tickwheel") and not doc["message"].startswith("tickwheel")
    (acked,) = [d for d in docs if "'s1' acked" in d["message"]]
    assert acked["level"] == "DEBUG"
    assert (acked["job_id"], acked["task"], acked["attempt"], acked["shard"]) == (
        "s1",
        "sink",
        1,
        0,
    )
    (dead,) = [d for d in docs if "dead-lettered" in d["message"]]
    assert dead["level"] == "ERROR" and dead["job_id"] == "bad" and "unknown task" in dead["reason"]
    assert any(d["message"].startswith("took shard 0") for d in docs)
