"""The command line at its edges (issue 42): every error under ``--json`` is one JSON
document and no traceback, no credential of a URL is ever printed, and what a job carries
(id, task, error) is escaped on the terminal. Subprocesses against a real redis-server."""

from __future__ import annotations

import json
import subprocess

import pytest
from durable_support import open_scheduler, run, unique_ns
from test_cli import cli

from tickwheel.durable import JobSpec, JobState
from tickwheel.durable.ops.cli._common import terminal
from tickwheel.durable.servers._redis import RedisServer

pytestmark = pytest.mark.redis

SECRET = "Hunter2secret"


def one_json_error(out: subprocess.CompletedProcess[str], code: int) -> dict[str, object]:
    """The run failed with ``code``, without a traceback, and printed exactly one JSON
    document (the error) on stdout."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    doc = json.loads(lines[0])
    assert doc["exit_code"] == code and doc["error"]
    return doc


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "a", "t", "--bogus"],
        ["schedule", "a"],
        ["no-such-command"],
        ["dead-letters"],
        ["inspect", "--shards", "x"],
        ["inspect", "--shards", "\u00b2"],
        ["dead-letters", "list", "--shard", "9", "--shards", "2"],
    ],
)
def test_an_argparse_error_under_json_is_one_document(argv: list[str]) -> None:
    out = cli(*argv, "--redis-url", "redis://127.0.0.1:1/0", "--json")
    one_json_error(out, 2)
    assert "usage:" in out.stderr  # the person still gets the usage line


def test_an_argparse_error_without_json_prints_no_json() -> None:
    out = cli("schedule", "a", "t", "--bogus")
    assert out.returncode == 2 and out.stdout == "" and "usage:" in out.stderr


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--at", "\u00b2"], "--at"),
        (["--at", "\u0663\u0663"], "--at"),
        (["--at", "9999-12-31T23:59:59-14:00"], "--at"),
        (["[" * 5000 + "]" * 5000], "payload"),
        (['{"a":' * 5000 + "1" + "}" * 5000], "payload"),
    ],
)
def test_bad_schedule_arguments_are_a_clean_usage_error(
    redis_server: RedisServer, extra: list[str], says: str
) -> None:
    argv = ["schedule", "a", "t", *extra, "--redis-url", redis_server.url]
    doc = one_json_error(cli(*argv, "--namespace", unique_ns(), "--json"), 2)
    assert says in str(doc["error"]) and len(str(doc["error"])) < 500
    plain = cli(*argv, "--namespace", unique_ns())
    assert plain.returncode == 2 and "Traceback" not in plain.stderr and plain.stdout == ""


def test_a_payload_deep_enough_to_fail_later_is_still_one_document(
    redis_server: RedisServer,
) -> None:
    """JSON decodes it; what comes after may refuse it: never a traceback."""
    deep = "[" * 900 + "]" * 900
    out = cli(
        "schedule", "a", "t", deep, "--redis-url", redis_server.url,
        "--namespace", unique_ns(), "--json",
    )  # fmt: skip
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len(out.stdout.strip().splitlines()) == 1, out.stdout[:500]


REDIS_URLS = [
    f"unix:///nonexistent/tw.sock?password={SECRET}",
    f"redis://127.0.0.1:1/0?db=0&password={SECRET}",
    f"redis://127.0.0.1:1/0?password={SECRET}&socket_timeout=x",
    f"redis://127.0.0.1:1/0?PassWord={SECRET}",
    f"redis://:pa/{SECRET}@127.0.0.1:1/0",
    f"redis://:pa#{SECRET}@127.0.0.1:1/0",
    f"redis://:pa?{SECRET}@127.0.0.1:1/0",
    f"redis://:{SECRET}@127.0.0.1:1/x",
    f"redis+cluster://:pa/{SECRET}@127.0.0.1:1",
]


@pytest.mark.parametrize("url", REDIS_URLS)
@pytest.mark.parametrize("command", [["inspect"], ["check"], ["dead-letters", "list"]])
def test_cli_errors_never_show_a_credential_of_the_redis_url(url: str, command: list[str]) -> None:
    for flags in (["--json"], []):
        out = cli(*command, "--redis-url", url, *flags)
        assert out.returncode in (2, 3), (out.returncode, out.stdout, out.stderr)
        both = out.stdout + out.stderr
        assert SECRET not in both and "'pa'" not in both, both
        assert "Traceback" not in both, both


def test_the_environment_url_is_not_shown_either() -> None:
    env = {"TICKWHEEL_REDIS_URL": f"redis://127.0.0.1:1/0?password={SECRET}"}
    out = cli("inspect", "--json", env=env)
    one_json_error(out, 3)
    assert SECRET not in out.stdout + out.stderr
    out = cli("inspect", "--shards", "x", "--json", env=env)
    one_json_error(out, 2)
    assert SECRET not in out.stdout + out.stderr


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://tw:pa#{SECRET}@127.0.0.1:1/tw",
        f"postgresql://tw:pa/{SECRET}@127.0.0.1:1/tw",
        f"postgresql://tw:sec?{SECRET}@127.0.0.1:1/tw",
        f"postgresql://tw:{SECRET}@127.0.0.1:1/tw",
        f"postgresql://127.0.0.1:1/tw?password={SECRET}",
    ],
)
def test_cli_errors_never_show_a_credential_of_the_postgres_url(url: str) -> None:
    out = cli("pg", "migrate", "--postgres-url", url, "--json")
    doc = one_json_error(out, out.returncode)
    assert out.returncode in (2, 5), doc
    both = out.stdout + out.stderr
    assert SECRET not in both and "'pa'" not in both and "'sec'" not in both, both


HOSTILE_ID = "job\x1b[2J\x1b]0;owned\x07\r\u202eevil"
HOSTILE_TASK = "task\x1b[31mred"
HOSTILE_ERROR = "boom\x1b[1A\x08\x08\nfake line"


async def _kill_hostile(url: str, ns: str) -> None:
    async with open_scheduler(url, ns, shards=2) as sched:
        await sched.schedule_many([JobSpec(HOSTILE_ID, HOSTILE_TASK, {"n": 1})])
        shard = sched.keys.shard_of(HOSTILE_ID)
        await sched.take(shard)
        batch = await sched.claim(shard, limit=10)
        (job,) = batch.jobs
        assert await sched.retry(job, HOSTILE_ERROR, final=True) is JobState.DEAD


def test_dead_letters_list_escapes_control_characters(redis_server: RedisServer) -> None:
    ns = unique_ns()
    run(_kill_hostile(redis_server.url, ns))
    o = ["--redis-url", redis_server.url, "--namespace", ns, "--shards", "2"]
    text = cli("dead-letters", "list", *o)
    assert text.returncode == 0, text.stderr
    for raw in ("\x1b", "\x07", "\r", "\x08", "\u202e"):
        assert raw not in text.stdout, repr(text.stdout)
    assert "\\x1b[2J" in text.stdout and "\\u202e" in text.stdout
    assert text.stdout.count("\n") == 2  # the total and one row: no forged line
    # JSON keeps the values as they are (escaped by JSON itself).
    doc = json.loads(cli("dead-letters", "list", *o, "--json").stdout)
    (row,) = doc["jobs"]
    assert (row["id"], row["task"]) == (HOSTILE_ID, HOSTILE_TASK)
    assert HOSTILE_ERROR in row["error"]
    # An error naming the id is escaped too.
    missing = cli("cancel", HOSTILE_ID + "x", *o)
    assert "\x1b" not in missing.stdout + missing.stderr


def test_terminal_escapes_what_rewrites_a_screen() -> None:
    assert terminal("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert terminal("x\ny") == "x\\ny"
    assert terminal("x\ny", lines=True) == "x\ny"
    assert terminal("\u202e\u200b\x7f\x9b") == "\\u202e\\u200b\\x7f\\x9b"
    assert (
        terminal("caf\u00e9 \u65e5\u672c \U0001f600\ttab")
        == "caf\u00e9 \u65e5\u672c \U0001f600\\ttab"
    )
