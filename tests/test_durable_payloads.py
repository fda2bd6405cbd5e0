"""Payloads at their edges (issue 42, findings 1 and 9): a record whose payload cannot be
decoded fails its own job only (the rest of its batch runs, and the listings, the CLI and
the dashboard carry on); what would not come back the same is refused at schedule time,
naming where in the payload; and generated hostile input is either refused cleanly or
runs with the same payload. Real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from typing import Any

import pytest
from dashboard_support import api_client
from durable_support import open_scheduler, run, snapshot, unique_ns
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spill_support import running_worker, until
from test_cli import cli

from tickwheel.durable import (
    MAX_PAYLOAD_DEPTH,
    JobSpec,
    JobState,
    Scheduler,
    TaskContext,
    TaskRegistry,
    UndecodablePayload,
)
from tickwheel.durable.servers._redis import RedisServer
from tickwheel.durable.store import EncodedJob, decode_payload, encode_job
from tickwheel.durable.store._msgpack import pack_str, unpack_reply

pytestmark = pytest.mark.redis

POISON = b"[" * 980 + b"]" * 980  # what an older version accepted: ~2 KB, 980 deep
PLACEHOLDER = "placeholder-payload"


def deep(depth: int) -> Any:
    """A list ``depth`` lists deep (0: a scalar)."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


async def schedule_raw(sched: Scheduler, spec: JobSpec, payload: bytes) -> None:
    """Write ``spec``'s job with ``payload`` as its JSON payload bytes, unchecked: the
    record as the codec packs it, as an older version (or a hand) would have written it."""
    enc = encode_job(spec, sched.max_payload_bytes)
    ident, mode, time_ms, record = enc.values
    old = pack_str(json.dumps(PLACEHOLDER).encode())
    assert record.count(old) == 1
    record = record.replace(old, pack_str(payload))
    shard = sched.keys.shard_of(spec.id)
    await sched.store.schedule_one(shard, EncodedJob(enc.id, (ident, mode, time_ms, record)), False)


# -- a poisoned record -----------------------------------------------------------------


def test_a_poisoned_payload_fails_only_its_own_job(redis_server: RedisServer) -> None:
    """Issue 42, finding 1: a 980-deep payload in a batch of six. Before, every claim
    of the shard raised RecursionError and all six went dead as 'lease expired'."""

    async def main() -> None:
        runs: dict[str, list[Any]] = {}
        reg = TaskRegistry()

        @reg.task(name="t")
        def record(ctx: TaskContext) -> None:
            runs.setdefault(ctx.job_id, []).append(ctx.payload)

        async with open_scheduler(redis_server.url, shards=1) as s:
            await schedule_raw(s, JobSpec("poisoned", "t", PLACEHOLDER, delay=0), POISON)
            innocents = {f"innocent-{i}": {"n": i} for i in range(5)}
            await s.schedule_many(JobSpec(i, "t", p, delay=0) for i, p in innocents.items())
            opts = {"lookahead": 0.1, "lease": 2.0, "poll_interval": 0.02, "reap_interval": 0.05}
            async with running_worker(s, reg, **opts) as w:
                assert await until(lambda: len(runs) == 5, 10), runs
                dead = await s.dead_letters(0)
                assert await until(lambda: w.loader is not None and w.loader.stats.dead == 1, 5)
                await asyncio.sleep(0.2)  # nothing runs twice
            assert runs == {i: [p] for i, p in innocents.items()}
            dead = await s.dead_letters(0)
            assert [j.id for j in dead.jobs] == ["poisoned"]
            (job,) = dead.jobs
            assert job.attempt == 1  # dead at once: no retry decodes it
            assert job.last_error.startswith("undecodable payload: nested too deep"), job
            assert job.payload == UndecodablePayload(job.payload.data, job.payload.reason)
            assert job.payload.data == POISON
            info = await s.get("poisoned")
            assert info is not None and info.state is JobState.DEAD
            assert isinstance(info.payload, UndecodablePayload)
            assert [i.dead for i in await s.inspect()] == [1]

    run(main())


def test_listings_cli_and_dashboard_show_an_undecodable_payload(
    redis_server: RedisServer,
) -> None:
    """Before, `dead-letters list --json` printed a traceback and the dashboard's pages
    of these jobs were 500s."""
    ns = unique_ns()

    async def setup() -> None:
        async with open_scheduler(redis_server.url, ns, shards=2) as s:
            far = JobSpec("p-due", "t", PLACEHOLDER, delay=3600)
            await schedule_raw(s, far, POISON)
            rec = JobSpec("p-every", "t", PLACEHOLDER, recurrence=s.recurrence(every=3600))
            await schedule_raw(s, rec, POISON)
            await schedule_raw(s, JobSpec("p-dead", "t", PLACEHOLDER, delay=0), b'{"a": [1')
            shard = s.keys.shard_of("p-dead")
            await s.take(shard)
            (job,) = [j for j in (await s.claim(shard, limit=10)).jobs if j.id == "p-dead"]
            assert isinstance(job.payload, UndecodablePayload)
            assert job.payload.reason.startswith("not JSON")
            assert await s.retry(job, str(job.payload), final=True) is JobState.DEAD
            for job_id in ("p-due", "p-every", "p-dead"):
                info = await s.get(job_id)
                assert info is not None and isinstance(info.payload, UndecodablePayload)
            assert sum(i.dead for i in await s.inspect()) == 1

    run(setup())
    o = ["--redis-url", redis_server.url, "--namespace", ns, "--shards", "2"]
    out = cli("dead-letters", "list", *o, "--json")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    (row,) = json.loads(out.stdout)["jobs"]
    assert row["id"] == "p-dead" and row["payload"] == '{"a": [1'
    assert row["payload_error"].startswith("undecodable payload: not JSON")
    text = cli("dead-letters", "list", *o)
    assert text.returncode == 0 and "p-dead" in text.stdout, text.stderr
    with api_client(redis_server.url, ns) as client:
        for path in ("/dead", "/api/dead", "/scheduled", "/api/scheduled", "/recurring", "/"):
            r = client.get(path)
            assert r.status_code == 200, (path, r.text[:300])
        for job_id in ("p-due", "p-every", "p-dead"):
            assert client.get("/job", params={"id": job_id}).status_code == 200
            doc = client.get("/api/job", params={"id": job_id}).json()
            assert "undecodable payload" in json.dumps(doc), doc
            assert '"payload_kind": "undecodable"' in json.dumps(doc), doc


def test_decoding_never_raises_for_depth_or_garbage() -> None:
    assert decode_payload(b"[" * 5000 + b"]" * 5000, 1).reason.startswith("nested too deep")
    assert decode_payload(b"\xff\xfe", 1).reason.startswith("not JSON")
    assert decode_payload(b"[1", 1).reason.startswith("not JSON")
    assert decode_payload(b"\xff", 0) == b"\xff"  # bytes are bytes
    at_limit = json.dumps(deep(MAX_PAYLOAD_DEPTH)).encode()
    assert decode_payload(at_limit, 1) == deep(MAX_PAYLOAD_DEPTH)
    # Brackets inside strings do not count.
    assert decode_payload(json.dumps(["[{" * 500]).encode(), 1) == ["[{" * 500]
    with pytest.raises(ValueError, match="not msgpack"):  # a reply nested too deep
        unpack_reply(b"\x91" * 5000 + b"\x90")


# -- refused at schedule time ----------------------------------------------------------

REFUSED: list[tuple[str, Any, type[Exception], str]] = [
    ("5000 deep", deep(5000), ValueError, r"payload must be nested at most 100"),
    ("101 deep", deep(101), ValueError, r"payload must be nested at most 100"),
    ("deep in a dict", {"a": [deep(100)]}, ValueError, r"at most 100 .*payload\['a'\]\[0\]"),
    ("int key", {1: "a"}, TypeError, r"payload keys must be str, got int 1 in payload "),
    ("colliding keys", {1: "a", "1": "b"}, TypeError, r"payload keys must be str"),
    ("bool key", {"x": {True: 1}}, TypeError, r"got bool True in payload\['x'\]"),
    ("tuple", (1, 2), TypeError, r"payload is a tuple, which would come back as a list"),
    ("tuple inside", [0, 1, 2, {"a": (1,)}], TypeError, r"payload\[3\]\['a'\] is a tuple"),
    ("lone surrogate", {"s": "\udc80"}, ValueError, r"payload\['s'\] is a str that is not valid"),
    ("surrogate key", {"\ud800": 1}, ValueError, r"payload keys must be valid Unicode"),
    ("nan inside", [1.0, [math.nan]], TypeError, r"payload\[1\]\[0\] is nan"),
    ("inf", {"x": -math.inf}, TypeError, r"payload\['x'\] is -inf"),
    ("a set", {"x": {1}}, TypeError, r"JSON-serialisable: payload\['x'\] is a set"),
    ("NUL in id", None, ValueError, r"job_id must not contain NUL"),
    ("NUL in task", None, ValueError, r"task must not contain NUL"),
    ("surrogate in id", None, ValueError, r"job_id must be valid Unicode"),
]


@pytest.mark.parametrize(
    ("case", "payload", "error", "message"), REFUSED, ids=[c[0] for c in REFUSED]
)
def test_schedule_refuses_what_would_not_come_back_the_same(
    redis_server: RedisServer, case: str, payload: Any, error: type[Exception], message: str
) -> None:
    job_id, task = "j", "t"
    if case == "NUL in id":
        job_id = "a\x00b"
    elif case == "NUL in task":
        task = "t\x00"
    elif case == "surrogate in id":
        job_id = "a\udc80"

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=2) as s:
            with pytest.raises(error, match=message):
                await s.schedule(job_id, task, payload)
            with pytest.raises(error, match=message):
                await s.schedule_many([JobSpec("ok", "t"), JobSpec(job_id, task, payload)])
            with pytest.raises(error, match=message):
                await s.schedule(job_id, task, payload, every=60)
            assert await snapshot(s) == {}

    run(main())


def test_what_a_payload_may_hold_comes_back_the_same(redis_server: RedisServer) -> None:
    payloads: list[Any] = [
        deep(MAX_PAYLOAD_DEPTH),
        {"a": [1, 2.5, -0.0, None, True, "\x00\u202e\U0001f600"], "": {"[": "]{"}},
        2**70,
        "",
        b"\x00\xff",
    ]

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=2) as s:
            for i, p in enumerate(payloads):
                await s.schedule(f"j{i}", "t", p, delay=60)
                info = await s.get(f"j{i}")
                assert info is not None and info.payload == p
                assert type(info.payload) is type(p)

    run(main())


# -- generated hostile input -----------------------------------------------------------

ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
HOSTILE_TEXT = st.sampled_from(
    ["", "a\x00b", "\udc80", "x" * 300, "\x1b[2J", "{ns}", "a:b", "\U0001f600" * 70, "\u202e"]
)
# Plain text (the default alphabet: no surrogates) most of the time, then any code point
# (NUL, lone surrogates, controls) and a list of known troublemakers.
IDS = st.text(max_size=70) | st.text(max_size=70) | st.text(ANY_CHAR, max_size=20) | HOSTILE_TEXT
TASKS = (
    st.just("t") | st.text(min_size=1, max_size=30) | st.text(ANY_CHAR, max_size=10) | HOSTILE_TEXT
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.text(ANY_CHAR, max_size=5)
    | HOSTILE_TEXT
)
KEYS = st.text(max_size=8) | st.text(max_size=8) | st.integers(-2, 2) | st.booleans()
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(KEYS, inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)
PAYLOADS = (
    JSONISH
    | st.binary(max_size=64)
    | st.integers(MAX_PAYLOAD_DEPTH - 2, 1500).map(deep)
    | st.builds(bytearray, st.binary(max_size=8))
    | st.just({1: "a", "1": "b"})
)


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same JSON types throughout (True is not 1, 1.0 is not 1)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_hostile_payloads_ids_and_tasks_are_refused_or_run_the_same(
    redis_server: RedisServer,
) -> None:
    """Either a clean TypeError/ValueError at schedule time (nothing written), or the
    job runs once with the same payload. One scheduler and one worker for every example."""
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    runs: dict[str, list[Any]] = {}
    reg = TaskRegistry()

    def record(ctx: TaskContext) -> None:
        runs.setdefault(ctx.job_id, []).append(ctx.payload)

    opts = {"lookahead": 0.1, "lease": 5.0, "poll_interval": 0.01, "reap_interval": 0.05}
    sched = loop.run_until_complete(
        stack.enter_async_context(open_scheduler(redis_server.url, shards=2))
    )
    loop.run_until_complete(stack.enter_async_context(running_worker(sched, reg, **opts)))
    counter = iter(range(1_000_000))
    outcomes = {"refused": 0, "ran": 0}

    async def one(job_id: str, task: str, payload: Any) -> None:
        try:
            if task not in reg:
                reg.register(record, name=task)
        except (TypeError, ValueError):
            pass  # the schedule below must refuse it the same
        try:
            await sched.schedule(job_id, task, payload, delay=0)
        except (TypeError, ValueError):
            outcomes["refused"] += 1
            with contextlib.suppress(TypeError, ValueError):  # a valid id: nothing written
                assert await sched.get(job_id) is None
            return
        assert task in reg
        assert await until(lambda: job_id in runs, 10), (job_id, task, payload)
        expected = bytes(payload) if isinstance(payload, bytes | bytearray) else payload
        assert len(runs[job_id]) == 1 and same(runs[job_id][0], expected), runs[job_id]
        outcomes["ran"] += 1

    @settings(
        max_examples=50,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(ids=IDS, task=TASKS, payload=PAYLOADS)
    def check(ids: str, task: str, payload: Any) -> None:
        loop.run_until_complete(one(f"{next(counter)}:{ids}", task, payload))

    try:
        check()
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
    assert outcomes["refused"] and outcomes["ran"], outcomes
