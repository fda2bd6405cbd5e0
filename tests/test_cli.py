"""The command line as a user drives it: subprocesses against real redis-servers, with
--json output parsed and exit codes asserted, every error path included."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.durable_support import open_scheduler, run, unique_ns
from tests.spill_support import SINK_ENV, TESTS_DIR
from tickwheel.durable import JobSpec
from tickwheel.durable.servers._redis import RedisClusterServer, RedisServer, free_port

pytestmark = pytest.mark.redis


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tickwheel.durable.ops.cli`` (without $TICKWHEEL_REDIS_URL unless given)."""
    base = {k: v for k, v in os.environ.items() if k != "TICKWHEEL_REDIS_URL"}
    return subprocess.run(
        [sys.executable, "-m", "tickwheel.durable.ops.cli", *argv],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=120,
        check=False,
    )


def cli_json(*argv: str, code: int = 0) -> Any:
    out = cli(*argv, "--json")
    assert out.returncode == code, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    return json.loads(out.stdout)


def opts(url: str, ns: str, shards: int = 4) -> list[str]:
    return ["--redis-url", url, "--namespace", ns, "--shards", str(shards)]


def test_schedule_inspect_cancel(redis_url: str) -> None:
    ns = unique_ns()
    o = opts(redis_url, ns)
    made = cli_json("schedule", "a", "send", '{"to": 1}', "--delay", "3600", *o)
    assert made["status"] == "created" and made["id"] == "a"
    assert cli_json("schedule", "a", "send", "--delay", "5", *o)["status"] == "kept"
    moved = cli_json("schedule", "a", "send", "--delay", "7200", "--replace", *o)
    assert moved["status"] == "replaced" and moved["when_ms"] > made["when_ms"]
    late = cli_json("schedule", "old", "send", "--at", "2020-01-01T00:00:00Z", *o)
    assert late["when_ms"] == 1577836800000
    rec = cli_json("schedule", "r", "tick", "--every", "60", "--missed", "skip", *o)
    assert rec["status"] == "created"
    cron = cli_json("schedule", "c", "tick", "--cron", "0 9 * * *", "--max-attempts", "2", *o)
    assert cron["status"] == "created"

    view = cli_json("inspect", *o)
    assert len(view["shards"]) == 4
    assert (view["due"], view["overdue"], view["leased"], view["dead"]) == (4, 1, 0, 0)
    assert view["max_lag_ms"] > 5 * 365 * 86400 * 1000  # "old" is due since 2020
    row = view["shards"][late["shard"]]
    assert row["overdue"] == 1 and row["oldest_overdue_ms"] == 1577836800000
    assert row["owner"] == "" and row["owner_ttl_ms"] == -2
    text = cli("inspect", *o)
    assert text.returncode == 0 and "4 due (1 overdue" in text.stdout

    assert cli_json("cancel", "a", *o) == {"id": "a", "cancelled": True, "result": "removed"}
    assert cli_json("cancel", "a", *o, code=1) == {
        "id": "a", "cancelled": False, "result": "not_found",
    }  # fmt: skip
    assert cli_json("inspect", *o)["due"] == 3


def test_inspect_sees_owners_leases_and_expired_leases(redis_url: str) -> None:
    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.schedule("j1", "t")
            await s.schedule("j2", "t")
            await s.take(0)
            await s.claim(0, limit=1, lease=0.001)
            await s.claim(0, limit=1, lease=60)
            await asyncio.sleep(0.01)
            (info,) = await s.inspect()
            assert (info.due, info.leased, info.expired, info.overdue) == (0, 2, 1, 0)
            assert info.owner == s.ownership.token and info.epoch == s.ownership.owned[0]
            assert 0 < info.owner_ttl_ms <= s.ownership.ttl_ms and info.lag_ms == 0
            await s.close()

    run(main())


def _dead_letters(url: str, ns: str, ids: list[str]) -> None:
    async def main() -> None:
        async with open_scheduler(url, ns, shards=4) as s:
            await s.schedule_many([JobSpec(i, "t", max_attempts=1) for i in ids])
            for shard in range(4):
                await s.take(shard)
                for job in (await s.claim(shard)).jobs:
                    await s.retry(job, "boom")
            await s.close()

    run(main())


def test_dead_letters_list_requeue_purge(redis_url: str) -> None:
    ns = unique_ns()
    o = opts(redis_url, ns)
    _dead_letters(redis_url, ns, ["d1", "d2", "d3"])
    page = cli_json("dead-letters", "list", *o)
    assert page["total"] == 3
    assert {j["id"] for j in page["jobs"]} == {"d1", "d2", "d3"}
    assert all(j["error"] == "boom" and j["task"] == "t" for j in page["jobs"])
    assert cli_json("dead-letters", "requeue", "d1", *o) == {"requeued": ["d1"], "missing": []}
    assert cli_json("dead-letters", "requeue", "d1", *o, code=1)["missing"] == ["d1"]
    assert cli_json("inspect", *o)["dead"] == 2
    assert sorted(cli_json("dead-letters", "purge", "--all", *o)["purged"]) == ["d2", "d3"]
    assert cli_json("dead-letters", "list", *o)["total"] == 0
    _dead_letters(redis_url, ns, ["d4"])  # (d1, requeued above, is claimed and dies again)
    assert sorted(cli_json("dead-letters", "requeue", "--all", *o)["requeued"]) == ["d1", "d4"]
    bad = cli("dead-letters", "purge", *o)
    assert bad.returncode == 2 and "give job ids, or --all" in bad.stderr
    bad = cli("dead-letters", "list", "--shard", "4", *o)
    assert bad.returncode == 2 and "--shard must be below --shards 4" in bad.stderr


def test_check_reports_aof_policy_and_cluster(redis_url: str, tmp_path: Path) -> None:
    ns = unique_ns()
    report = cli_json("check", *opts(redis_url, ns), code=1)  # the session server: no AOF
    assert report["aof_enabled"] is False and report["maxmemory_policy"] == "noeviction"
    on_cluster = "cluster" in redis_url
    assert report["cluster_enabled"] is on_cluster
    assert report["cluster_state"] == ("ok" if on_cluster else None)
    assert any("AOF is off" in p for p in report["problems"])
    assert report["namespace_shards"] is None and not report["ok"]
    with RedisServer(appendonly=True, data_dir=tmp_path / "aof") as good:
        report = cli_json("check", *opts(good.url, ns))
        assert report["ok"] and report["aof_enabled"] is True and report["version"]
        text = cli("check", *opts(good.url, ns))
        assert text.returncode == 0 and "aof_enabled       True" in text.stdout
    cluster_args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
    with RedisServer(appendonly=True, extra_args=cluster_args) as node:
        # A lone cluster node with no slots assigned: the cluster state is "fail".
        report = cli_json("check", *opts(node.url, ns), code=1)
        assert report["cluster_enabled"] is True and report["cluster_state"] == "fail"
        assert any("cluster_state" in p for p in report["problems"])


def test_one_nodes_plain_url_is_enough_for_a_cluster(redis_cluster: RedisClusterServer) -> None:
    """A plain redis:// URL of any node (here a replica's) reaches the whole cluster:
    the CLI asks the node, finds cluster_enabled:1 and follows the slot map."""
    ns = unique_ns()
    o = opts(redis_cluster.nodes[-1].url, ns, shards=8)
    made = [cli_json("schedule", f"j{i}", "send", "--delay", "3600", *o) for i in range(8)]
    assert {m["status"] for m in made} == {"created"}
    assert len({m["shard"] for m in made}) > 1  # on more than one master's slots
    view = cli_json("inspect", *o)
    assert view["due"] == 8 and len(view["shards"]) == 8
    report = cli_json("check", *o, code=1)  # AOF is off on the test cluster
    assert report["cluster_enabled"] is True and report["cluster_state"] == "ok"
    assert report["namespace_shards"] == 8


def test_errors_a_person_understands(redis_url: str) -> None:
    ns = unique_ns()
    cli_json("schedule", "x", "t", *opts(redis_url, ns, shards=4))
    # Another shard count: the stored one and the flag to pass, for every command.
    for argv in (["inspect"], ["schedule", "y", "t"], ["cancel", "x"], ["check"]):
        out = cli(*argv, *opts(redis_url, ns, shards=8))
        assert out.returncode == 4, (argv, out.stderr)
        assert "created with 4 shards" in out.stderr and "--shards 4" in out.stderr
        assert "Traceback" not in out.stderr
    err = cli_json("inspect", *opts(redis_url, ns, shards=8), code=4)
    assert err["exit_code"] == 4 and "--shards 4" in err["error"]
    # check reports the server too, in the one JSON document (json.loads refuses two).
    report = cli_json("check", *opts(redis_url, ns, shards=8), code=4)
    assert report["exit_code"] == 4 and "--shards 4" in report["error"]
    assert report["namespace_shards"] == 4 and report["version"]

    # Nobody listens on a free port: host:port and what to check.
    port = free_port()
    for argv in (["inspect"], ["schedule", "y", "t"], ["check"], ["dead-letters", "list"]):
        out = cli(*argv, "--redis-url", f"redis://127.0.0.1:{port}/0")
        assert out.returncode == 3, (argv, out.stderr)
        assert f"cannot reach Redis at 127.0.0.1:{port}" in out.stderr
        assert "redis-server runs there" in out.stderr and "Traceback" not in out.stderr
    worker = cli(
        "worker", "spill_support:registry", "--redis-url", f"redis://127.0.0.1:{port}",
        env={"PYTHONPATH": str(TESTS_DIR)},
    )  # fmt: skip
    assert worker.returncode == 3 and "cannot reach Redis" in worker.stderr

    # Malformed URLs name --redis-url and the problem.
    for url, said in [
        ("http://127.0.0.1:6379", "url scheme must be one of redis, rediss, unix"),
        ("127.0.0.1:6379", "url must look like redis://host:port/db"),
        ("redis://127.0.0.1:99999/0", "port must be in 1..65535"),
        ("redis://127.0.0.1:1/zero", "database must be a number"),
        ("redis:///0", "names no host"),
    ]:
        out = cli("inspect", "--redis-url", url)
        assert out.returncode == 2, (url, out.stderr)
        assert "--redis-url" in out.stderr and said in out.stderr, (url, out.stderr)

    # No URL at all; the environment variable is the default.
    out = cli("inspect")
    assert out.returncode == 2 and "--redis-url is required (or set TICKWHEEL_REDIS_URL)" in (
        out.stderr
    )
    env = {"TICKWHEEL_REDIS_URL": redis_url}
    out = cli("inspect", "--namespace", ns, "--shards", "4", "--json", env=env)
    assert out.returncode == 0 and json.loads(out.stdout)["due"] == 1


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["schedule", "j", "t", "{not json"], "payload must be JSON"),
        (["schedule", "j", "t", "--delay", "-1"], "--delay"),
        (["schedule", "j", "t", "--delay", "1", "--at", "5"], "not allowed with argument"),
        (["schedule", "j", "t", "--at", "2030-01-01T00:00:00"], "--at needs a time zone"),
        (["schedule", "j", "t", "--at", "tomorrow"], "--at must be epoch ms or ISO 8601"),
        (["schedule", "j", "t", "--cron", "not a cron"], "cron"),
        (["schedule", "j", "t", "--missed", "never"], "--missed"),
        (["schedule", "", "t"], "job_id"),
        (["inspect", "--shards", "0"], "--shards"),
        (["inspect", "--namespace", "a{b"], "namespace"),
        (["worker", "no_colon"], "MODULE:ATTRIBUTE"),
        (["worker", "spill_support:registry", "--metrics-port", "70000"], "--metrics-port"),
        (["nonsense"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_naming_them(redis_url: str, argv: list[str], said: str) -> None:
    out = cli(argv[0], "--redis-url", redis_url, "--namespace", unique_ns(), *argv[1:])
    assert out.returncode == 2, out.stderr
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_help_lists_commands_and_exit_codes() -> None:
    out = cli("--help")
    assert out.returncode == 0
    for word in ("demo", "wheel-demo", "worker", "schedule", "cancel", "inspect", "check"):
        assert word in out.stdout
    assert "exit codes:" in out.stdout and "3  Redis unreachable" in out.stdout
    assert "exit codes:" in cli("inspect", "--help").stdout


def test_worker_serves_prometheus_metrics(redis_url: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    ns = unique_ns()
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR), **{SINK_ENV: redis_url})
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tickwheel.durable.ops.cli", "worker", "spill_support:registry",
            *opts(redis_url, ns), "--no-check", "--metrics-port", str(port),
            "--poll-interval", "0.05", "--lookahead", "0.2",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert started["event"] == "started" and started["metrics_port"] == port

        async def schedule() -> None:
            async with open_scheduler(redis_url, ns, shards=4) as s:
                await s.schedule_many(
                    [JobSpec(f"m{i}", "sink", {"sink": ns}, delay=0.1) for i in range(20)]
                )

        run(schedule())
        values: dict[tuple[str, str], float] = {}
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
            values = {
                (sample.name, sample.labels.get("kind", sample.labels.get("le", ""))): sample.value
                for family in text_string_to_metric_families(body.decode())
                for sample in family.samples
                if sample.labels.get("namespace") == ns
            }
            if values.get(("tickwheel_acks_total", ""), 0) >= 20:
                break
            time.sleep(0.1)
        assert values[("tickwheel_acks_total", "")] == 20
        assert values[("tickwheel_claimed_jobs_total", "")] == 20
        assert values[("tickwheel_claim_calls_total", "")] >= 1
        assert values[("tickwheel_shard_moves_total", "taken")] == 4
        assert values[("tickwheel_owned_shards", "")] == 4
        assert values[("tickwheel_job_lateness_seconds_count", "")] == 20
        assert values[("tickwheel_job_lateness_seconds_bucket", "+Inf")] == 20
        assert values[("tickwheel_wheel_fired_total", "")] >= 20
        for name in ("retries", "dead_letters", "reaped", "fenced", "dedup_dropped"):
            assert values[(f"tickwheel_{name}_total", "")] == 0, name
        # Per task, labelled task (bounded: MAX_TASKS names per worker).
        per_task = {
            (
                sample.name,
                sample.labels["task"],
                sample.labels.get("outcome", sample.labels.get("le", "")),
            ): sample.value
            for family in text_string_to_metric_families(body.decode())
            for sample in family.samples
            if sample.labels.get("namespace") == ns and "task" in sample.labels
        }
        assert per_task[("tickwheel_task_runs_total", "sink", "started")] == 20
        assert per_task[("tickwheel_task_runs_total", "sink", "acked")] == 20
        assert per_task[("tickwheel_task_runs_total", "sink", "dead")] == 0
        assert per_task[("tickwheel_task_lateness_seconds_bucket", "sink", "+Inf")] == 20
        assert per_task[("tickwheel_task_lateness_seconds_sum", "sink", "")] >= 0
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    stopped = json.loads(out.splitlines()[-1])
    assert stopped["scheduler"]["acked"] == 20 and stopped["scheduler"]["shards_given_back"] == 4
    assert stopped["tasks"]["sink"][:4] == [20, 20, 0, 0]  # runs, acked, retries, dead
    # inspect sums every worker's chart samples per task (the last 5 min).
    tasks = cli_json("inspect", *opts(redis_url, ns))["tasks"]
    assert tasks["sink"] == {"runs": 20, "acked": 20, "retries": 0, "dead": 0}
    text = cli("inspect", *opts(redis_url, ns)).stdout
    assert "task 'sink', last 5 min: 20 run(s), 20 acked, 0 retried, 0 dead" in text


def test_metrics_without_prometheus_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tickwheel.durable.ops import metrics as _metrics

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError, match=r"tickwheel\[prometheus\]"):
        _metrics.load_prometheus_client()


def test_logging_is_quiet_by_default_and_verbose_on_request(redis_url: str) -> None:
    # The session server has no AOF: check_server logs a warning. Unconfigured, the
    # library prints nothing (the warning itself is filtered here).
    code = (
        "import asyncio, warnings\n"
        "from tickwheel.durable import check_server\n"
        "from tickwheel.durable.store._connect import client_from_url\n"
        "warnings.simplefilter('ignore')\n"
        f"c = client_from_url({redis_url!r})\n"
        "asyncio.run(check_server(c))\n"
    )
    quiet = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = cli("check", "-v", *opts(redis_url, unique_ns()))
    assert loud.returncode == 1
    # On a cluster each master's problem is prefixed with its host:port.
    assert "WARNING tickwheel.durable: server check: " in loud.stderr
    assert "AOF is off" in loud.stderr


def test_demo_short_form_loses_nothing() -> None:
    """The README's demo, short: embedded Redis, a worker killed, lost = 0, none early."""
    out = cli("demo", "--seconds", "4", "--jobs", "200", "--json")
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    summary = json.loads(out.stdout.splitlines()[-1])
    durable = summary["durable"]
    assert durable["lost"] == 0 and durable["early"] == 0
    assert durable["fired"] >= 200 + 3  # every one-shot job and some recurring runs
    assert summary["wheel"]["early"] == 0 and summary["wheel"]["fired"] > 0
    assert summary["killed_at"] is not None


def test_wheel_demo_still_runs() -> None:
    out = cli("wheel-demo", "--timers", "2000", "--resets", "100", "--spread", "0.2")
    assert out.returncode == 0, out.stderr
    assert "wheel on asyncio" in out.stdout and "call_later on asyncio" in out.stdout


def test_redis_error_replies_are_one_sentence(redis_url: str, private_redis: Any) -> None:
    """An error reply from Redis (WRONGTYPE, OOM at maxmemory) exits 1 naming the
    Redis error, without a traceback."""
    import redis as redis_sync

    ns = unique_ns()
    o = opts(redis_url, ns)
    cli_json("schedule", "x", "t", *o)

    async def break_meta() -> None:
        async with open_scheduler(redis_url, ns, shards=4) as s:
            client = s.store.client
            await client.delete(s.keys.meta)
            await client.hset(s.keys.meta, "not", "a string")
            await s.close()

    run(break_meta())
    for argv in (["inspect"], ["schedule", "y", "t"], ["cancel", "x"], ["dead-letters", "list"]):
        out = cli(*argv, *o)
        assert out.returncode == 1, (argv, out.stderr)
        assert "WRONGTYPE" in out.stderr and "Traceback" not in out.stderr, out.stderr
    err = cli_json("inspect", *o, code=1)
    assert "WRONGTYPE" in err["error"] and err["exit_code"] == 1

    plain = redis_sync.Redis.from_url(private_redis.url)
    try:
        plain.config_set("maxmemory", "1")
        out = cli("schedule", "z", "t", *opts(private_redis.url, ns))
    finally:
        plain.config_set("maxmemory", "0")
        plain.close()
    assert out.returncode == 1, out.stderr
    assert "OutOfMemoryError" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_due_times_a_datetime_cannot_show_are_refused_before_writing(redis_url: str) -> None:
    ns = unique_ns()
    o = opts(redis_url, ns)
    for argv, said in [
        (["--at", "253402300800000"], "--at must be between"),
        (["--at", "9999-12-31T23:00:00-05:00"], "--at must be between"),
        (["--delay", "1e13"], "--delay must fall due before year 10000"),
        (["--every", "1e13"], "--every must fall due before year 10000"),
    ]:
        for fmt in ([], ["--json"]):
            out = cli("schedule", "far", "t", *argv, *o, *fmt)
            assert out.returncode == 2, (argv, out.stderr)
            assert said in out.stderr and "Traceback" not in out.stderr, out.stderr
    made = cli_json("schedule", "edge", "t", "--at", "253402300799999", *o)
    assert made["due"] == "9999-12-31T23:59:59.999+00:00"
    text = cli("inspect", *o)
    assert text.returncode == 0 and "9999-12-31T23:59:59.999" in text.stdout, text.stderr
    assert cli("cancel", "far", *o).returncode == 1  # nothing was written
    assert cli_json("inspect", *o)["due"] == 1


def _namespace_keys(url: str, ns: str) -> list[bytes]:
    from tickwheel.durable.store._connect import connect

    async def main() -> list[bytes]:
        client = await connect(url)
        try:
            return [k async for k in client.scan_iter(match=f"*{ns}*")]
        finally:
            await client.aclose()

    return run(main())


def test_read_only_commands_do_not_create_a_namespace(redis_url: str) -> None:
    ns = unique_ns()
    o = opts(redis_url, ns)
    assert cli_json("inspect", *o, code=1) == {"namespace": ns, "created": False}
    page = cli_json("dead-letters", "list", *o, code=1)
    assert page == {"namespace": ns, "created": False, "total": 0, "jobs": []}
    assert cli_json("cancel", "x", *o, code=1) == {
        "namespace": ns, "created": False, "id": "x", "cancelled": False, "result": "not_found",
    }  # fmt: skip
    assert cli_json("dead-letters", "purge", "x", *o, code=1)["missing"] == ["x"]
    assert cli_json("dead-letters", "requeue", "--all", *o, code=1)["requeued"] == []
    for argv in (["inspect"], ["dead-letters", "list"], ["cancel", "x"]):
        out = cli(*argv, *o)
        assert out.returncode == 1 and f"namespace {ns!r} not created" in out.stdout, out
    assert _namespace_keys(redis_url, ns) == []
    # Another shard count on an absent namespace is no mismatch: there is nothing yet.
    assert cli("inspect", *opts(redis_url, ns, shards=8)).returncode == 1
    cli_json("schedule", "x", "t", *o)  # a producer creates it
    assert cli_json("inspect", *o)["created"] is True
    assert cli("inspect", *opts(redis_url, ns, shards=8)).returncode == 4


def test_a_namespace_with_another_bucket_count_is_read_with_it(redis_url: str) -> None:
    async def main(ns: str) -> None:
        async with open_scheduler(redis_url, ns, shards=4, buckets=8) as s:
            await s.schedule("b", "t", delay=3600)
            await s.close()

    ns = unique_ns()
    run(main(ns))
    o = opts(redis_url, ns)
    assert cli_json("inspect", *o)["due"] == 1
    assert cli_json("cancel", "b", *o)["cancelled"] is True


def test_dead_letters_options_that_would_be_ignored_are_refused(redis_url: str) -> None:
    o = opts(redis_url, unique_ns())
    for argv, said in [
        (["purge", "a", "--shard", "1"], "--shard goes with --all"),
        (["requeue", "a", "--shard", "1"], "--shard goes with --all"),
        (["list", "a"], "dead-letters list takes no job ids"),
        (["list", "--all"], "dead-letters list takes no --all"),
        (["list", "--limit", "5000"], "--limit"),
    ]:
        out = cli("dead-letters", *argv, *o)
        assert out.returncode == 2, (argv, out.stderr)
        assert said in out.stderr and "Traceback" not in out.stderr, (argv, out.stderr)


def test_demo_on_a_cluster_loses_nothing(redis_cluster: RedisClusterServer) -> None:
    """The demo on a given Redis Cluster, by a plain URL of one node and by its
    redis+cluster:// URL: the task reads TIME outside a pipeline, so every run counts."""
    for url in (redis_cluster.nodes[0].url, redis_cluster.url):
        out = cli("demo", "--redis-url", url, "--seconds", "4", "--jobs", "100", "--json")
        assert out.returncode == 0, (url, out.stdout[-2000:], out.stderr[-2000:])
        assert "Traceback" not in out.stderr, out.stderr[-2000:]
        durable = json.loads(out.stdout.splitlines()[-1])["durable"]
        assert durable["lost"] == 0 and durable["early"] == 0, durable
        assert durable["fired"] >= 100 + 3


def test_options_a_command_would_ignore_are_refused() -> None:
    out = cli("wheel-demo", "--resets", "-5", "--timers", "10")
    assert out.returncode == 2 and "--resets" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    # The worker prints JSON lines always: it has no --json to ignore.
    out = cli("worker", "spill_support:registry", "--redis-url", "redis://127.0.0.1:1", "--json")
    assert out.returncode == 2 and "unrecognized arguments: --json" in out.stderr, out.stderr


def test_messages_never_show_a_password() -> None:
    port = free_port()
    for url, code in [
        (f"redis://u:s3cret@127.0.0.1:{port}/0", 3),
        (f"redis://u:s3cret@127.0.0.1:{port}/0?socket_timeout=abc", 2),
        (f"http://u:s3cret@127.0.0.1:{port}/0", 2),
        (f"u:s3cret@127.0.0.1:{port}", 2),
        ("redis://u:s3cret@[::1/0", 2),
    ]:
        out = cli("inspect", "--redis-url", url, "--json")
        assert out.returncode == code, (url, out.stderr)
        assert "s3cret" not in out.stderr + out.stdout, url
        assert out.stderr.count("cannot reach Redis at") == (code == 3), out.stderr


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 0), ("SIGINT", 130)])
def test_worker_stops_gracefully_on_sigterm_and_ctrl_c(redis_url: str, sig: str, code: int) -> None:
    import signal

    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    env.pop("TICKWHEEL_REDIS_URL", None)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "tickwheel.durable.ops.cli", "worker", "spill_support:registry",
            *opts(redis_url, unique_ns()), "--no-check", "--poll-interval", "0.05",
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["event"] == "started"
        proc.send_signal(getattr(signal, sig))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert json.loads(out.splitlines()[-1])["event"] == "stopped"  # the graceful stop
    assert "Traceback" not in err


def test_a_refusal_the_library_calls_unavailable_is_not_unreachable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The library may raise RedisUnavailable from an error reply (OOM, LOADING): the
    server answered, so the command says what it refused (exit 1), not "cannot reach"."""
    import argparse

    import redis.exceptions

    from tickwheel.durable.model import RedisUnavailable
    from tickwheel.durable.ops.cli import _common

    async def body() -> int:
        try:
            raise redis.exceptions.OutOfMemoryError("command not allowed (maxmemory)")
        except redis.exceptions.RedisError as exc:
            raise RedisUnavailable(f"redis unavailable: {exc}") from exc

    args = argparse.Namespace(command="schedule", redis_url="redis://127.0.0.1:1/0", json=False)
    assert _common.run(args, body) == 1
    err = capsys.readouterr().err
    assert "Redis refused the command: OutOfMemoryError" in err and "cannot reach" not in err
