"""The ``tickwheel`` command: the demo, a worker, and what an operator needs.

Commands:

    tickwheel demo            wheel timers and durable jobs on an embedded Redis; one of
                              two workers is killed (SIGKILL) mid-way; nothing is lost
    tickwheel wheel-demo      the timing wheel beside asyncio's timers, in memory
    tickwheel worker M:ATTR   run durable jobs with the tasks of a TaskRegistry
    tickwheel schedule ID TASK [PAYLOAD]   schedule a job (payload as JSON)
    tickwheel cancel ID       remove a job in any state
    tickwheel inspect         per shard: due, overdue (lag), leased, dead, owner, next due
    tickwheel dead-letters list|requeue|purge
    tickwheel check           server version, AOF, maxmemory-policy, cluster state
    tickwheel dashboard       a web UI and JSON API over a namespace (tickwheel[dashboard])
    tickwheel pg migrate|status|prune   the Postgres mode's schema, and retention
    tickwheel reconcile       rebuild the Redis index from PostgreSQL (Postgres mode)

Every command but the demos takes ``--redis-url`` (default ``$TICKWHEEL_REDIS_URL``),
``--postgres-url`` (default ``$TICKWHEEL_POSTGRES_URL``: the Postgres mode, see
docs/postgres.md), ``--namespace``, ``--shards``, ``--json`` (one JSON document on
stdout, for scripts; not ``worker``, which prints JSON lines always) and
``-v``/``--verbose`` (log INFO, or DEBUG with ``-vv``, to stderr). ``inspect``,
``dead-letters`` and ``cancel`` never create a namespace (one that does not exist is
reported, exit 1).

Exit codes:

    0  success
    1  the command ran and found a failure: problems in ``check``, no such job for
       ``cancel``, a job not scheduled (busy/done), a namespace not created, an error
       reply from Redis (OOM, WRONGTYPE, NOPERM), a lost or early job in a demo
    2  bad usage: a bad argument or option, a malformed ``--redis-url``
    3  Redis unreachable (connection refused, timeout, authentication)
    4  the namespace was created with another shard count (pass the stored one)
    5  PostgreSQL unreachable (Postgres mode)
    130  interrupted (Ctrl-C); the demo still stops its workers and its Redis
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import json
import logging
import os
import re
import secrets
import signal
import sys
import time
import urllib.parse
import warnings
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from tickwheel.durable._check import ServerReport, check_server
from tickwheel.durable._connect import (
    URL_ENV,
    Client,
    client_from_url,
    connect,
    parse_nodes,
    shown_url,
    split_url,
)
from tickwheel.durable._errors import (
    DurableError,
    PostgresUnavailable,
    RedisUnavailable,
    SchemaNotReady,
    ServerCheckFailed,
    ShardCountMismatch,
)
from tickwheel.durable._keys import DEFAULT_BUCKETS, Keys, parse_layout
from tickwheel.durable._loader import (
    DEFAULT_LIMIT,
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLL_INTERVAL,
)
from tickwheel.durable._model import DEFAULT_MAX_ATTEMPTS, JobInfo, ScheduleStatus, ShardInfo
from tickwheel.durable._ownership import DEFAULT_OWNER_TTL
from tickwheel.durable._reaper import DEFAULT_REAP_INTERVAL
from tickwheel.durable._recurrence import MissedRun
from tickwheel.durable._scheduler import DEFAULT_LEASE, DEFAULT_SHARDS, MAX_BATCH, Scheduler
from tickwheel.durable._tasks import TaskRegistry
from tickwheel.durable._worker import DEFAULT_DRAIN_TIMEOUT, DEFAULT_RECONCILE_INTERVAL, Worker

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_MISMATCH",
    "EXIT_OK",
    "EXIT_PG_UNREACHABLE",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CliError",
    "main",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_MISMATCH = 4
EXIT_PG_UNREACHABLE = 5
# The Postgres mode's DSN, when --postgres-url is not given.
PG_URL_ENV = "TICKWHEEL_POSTGRES_URL"
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT

EPILOG = """\
exit codes:
  0  success
  1  the command ran and found a failure (check problems, no such job or namespace,
     an error reply from Redis, a lost job)
  2  bad usage (a bad argument, a malformed --redis-url)
  3  Redis unreachable (connection refused, timeout, authentication)
  4  the namespace was created with another shard count (pass the stored one)
  5  PostgreSQL unreachable (Postgres mode)
  130  interrupted (Ctrl-C); what the command started was stopped

--redis-url defaults to $TICKWHEEL_REDIS_URL, --postgres-url to $TICKWHEEL_POSTGRES_URL.
--json prints one JSON document on stdout.
"""


logger = logging.getLogger("tickwheel.durable")


class CliError(Exception):
    """A failure the command reports in one sentence (no traceback) with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code  # the exit code


# -- Redis clients -------------------------------------------------------------------


def check_url(url: str) -> str:
    """Check a Redis URL's shape and return where it points (``host:port`` or a path),
    without its password.

    Raises:
        CliError: (usage) naming ``--redis-url`` and what is wrong with it.
    """
    try:
        scheme, _, hosts, rest = split_url(url)
        if scheme == "unix":
            path = urllib.parse.urlsplit(url).path
            if not path:
                raise ValueError(f"{url!r} names no socket path")
            return path
        if not hosts:
            raise ValueError(f"{url!r} names no host")
        nodes = parse_nodes(hosts)
    except (TypeError, ValueError) as exc:
        raise CliError(
            EXIT_USAGE,
            f"--redis-url: {_hide(url, exc)} (for example redis://127.0.0.1:6379/0, or "
            "redis+cluster://host:port,host:port for a Redis Cluster)",
        ) from None
    db = rest.partition("?")[0].strip("/")
    if db and not db.isdigit():
        raise CliError(EXIT_USAGE, f"--redis-url database must be a number, got {db!r}")
    return ",".join(f"{h}:{p}" for h, p in nodes)


async def _connect(url: str) -> Client:
    """The one place the command line makes a Redis client: one Redis, or a Redis
    Cluster for a ``redis+cluster://`` URL, a list of hosts, or a plain URL of a node
    that reports ``cluster_enabled:1`` (so any node's address is enough).

    Raises:
        CliError: (usage) for a malformed URL.
        RedisUnavailable: if nothing answers there.
    """
    check_url(url)
    try:
        return await connect(url)
    except ValueError as exc:  # redis-py's own URL checks (query options)
        raise CliError(EXIT_USAGE, f"--redis-url {shown_url(url)!r}: {_hide(url, exc)}") from None


def _hide(url: str, exc: BaseException) -> str:
    """An exception's message with ``url`` in it shown without its password."""
    return str(exc).replace(url, shown_url(url)) if isinstance(url, str) else str(exc)


def _unreachable(url: str, exc: BaseException) -> CliError:
    where = check_url(url)
    # The library's message starts "cannot reach Redis at URL: "; said once here.
    reason = re.sub(r"^(redis unavailable: )?cannot reach Redis at \S+: ", "", _hide(url, exc))
    return CliError(
        EXIT_UNREACHABLE,
        f"cannot reach Redis at {where} ({reason}). Check that redis-server runs there "
        "and accepts connections from this host (bind address, port, firewall, password), "
        f"or pass another --redis-url (or set {URL_ENV}).",
    )


def _mismatch(args: argparse.Namespace, exc: ShardCountMismatch) -> CliError:
    (shards, buckets), (given, given_buckets) = exc.stored, exc.given
    if shards != given:
        hint = f"pass --shards {shards}"
    else:
        hint = f"its bucket count is {buckets}, this command uses {given_buckets}"
    return CliError(
        EXIT_MISMATCH,
        f"namespace {args.namespace!r} was created with {shards} shards, "
        f"and this command was given --shards {given}: {hint} "
        "(changing the count would strand its jobs)",
    )


# -- running a command ---------------------------------------------------------------


def _emit(args: argparse.Namespace, data: Any, text: str | Callable[[], str]) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text`` (made only then, when a
    callable)."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=str), flush=True)
        args.emitted = True  # the one JSON document: an error after it is on stderr only
    else:
        print(text() if callable(text) else text, flush=True)


def _fail(args: argparse.Namespace, error: CliError) -> int:
    print(f"tickwheel {args.command}: {error}", file=sys.stderr)
    if getattr(args, "json", False) and not getattr(args, "emitted", False):
        print(json.dumps({"error": str(error), "exit_code": error.code}), flush=True)
    return error.code


def _run(args: argparse.Namespace, body: Callable[[], Awaitable[int]]) -> int:
    """Run an async command body and turn the errors a person acts on into exit codes."""
    try:
        return asyncio.run(_guarded(args, body))
    except CliError as error:
        return _fail(args, error)
    except KeyboardInterrupt:
        print(f"tickwheel {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


async def _guarded(args: argparse.Namespace, body: Callable[[], Awaitable[int]]) -> int:
    url = getattr(args, "redis_url", None)
    try:
        return await body()
    except ShardCountMismatch as exc:
        raise _mismatch(args, exc) from None
    except (RedisUnavailable, redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as e:
        refusal = _refusal(e)
        if refusal is not None:  # it answered: with an error reply, not "unreachable"
            raise refusal from None
        raise _unreachable(url or "", e) from None
    except ServerCheckFailed as exc:
        raise CliError(EXIT_FAILED, f"the server may lose jobs: {exc}") from None
    except PostgresUnavailable as exc:
        raise CliError(
            EXIT_PG_UNREACHABLE,
            f"cannot reach PostgreSQL ({exc}). Check --postgres-url (or ${PG_URL_ENV}).",
        ) from None
    except SchemaNotReady as exc:
        raise CliError(EXIT_FAILED, str(exc)) from None
    except (ValueError, TypeError) as exc:  # a bad argument, named by the library
        raise CliError(EXIT_USAGE, str(exc)) from None
    except DurableError as exc:
        raise CliError(EXIT_FAILED, f"{type(exc).__name__}: {exc}") from None
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
        # An error reply (OOM at maxmemory, WRONGTYPE, NOPERM, a cluster that is down):
        # the command reached Redis, which refused it.
        raise CliError(
            EXIT_FAILED, f"Redis refused the command: {type(exc).__name__}: {exc}"
        ) from None


def _refusal(exc: BaseException) -> CliError | None:
    """For a RedisUnavailable made of an error reply (the library may class OOM, LOADING,
    BUSY, NOREPLICAS as transient): that reply, as exit 1; else None."""
    cause = exc.__cause__
    if not isinstance(exc, RedisUnavailable) or not isinstance(cause, redis.exceptions.RedisError):
        return None
    if isinstance(cause, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return None
    return CliError(EXIT_FAILED, f"Redis refused the command: {type(cause).__name__}: {cause}")


async def _with_scheduler(
    args: argparse.Namespace,
    fn: Callable[[Scheduler], Awaitable[int]],
    *,
    absent: Callable[[], int] | None = None,
) -> int:
    """Open a scheduler on the command's URL, namespace and shard count; run ``fn``.

    The namespace's stored layout is read first (one GET of its meta key, no write):
    a namespace that exists is opened with its stored bucket count; one that does not
    is created (its layout stored) only when ``absent`` is None, else ``absent()`` runs
    instead and nothing is written.
    """
    client = await _connect(args.redis_url)
    try:
        meta: Any = await client.get(Keys(args.namespace, args.shards).meta)  # bytes | None
        stored = _layout(meta)
        if stored is None and absent is not None:
            return absent()
        buckets = stored[1] if stored else DEFAULT_BUCKETS
        scheduler = Scheduler(
            client,
            args.namespace,
            shards=args.shards,
            buckets=buckets,
            check=False,
            postgres_url=getattr(args, "postgres_url", None),
        )
        try:
            await scheduler.open()  # a shard count mismatch is refused here
            return await fn(scheduler)
        finally:
            await scheduler.close()  # its own connections (PostgreSQL's pool), not client
    finally:
        await client.aclose()


def _layout(stored: bytes | None) -> tuple[int, int] | None:
    """A meta key's ``shards:buckets``; None when absent, (0, DEFAULT_BUCKETS) when it
    cannot be read (then reported as a mismatch with any shard count)."""
    if stored is None:
        return None
    try:
        return parse_layout(stored)
    except ValueError:
        return 0, DEFAULT_BUCKETS


def _not_created(args: argparse.Namespace, data: dict[str, Any], what: str = "") -> int:
    """Report a namespace that does not exist (nothing was written): exit 1."""
    text = (
        f"namespace {args.namespace!r} not created: nothing was ever scheduled in it "
        "(check --namespace and --redis-url)"
    )
    _emit(args, {"namespace": args.namespace, "created": False, **data}, what + text)
    return EXIT_FAILED


# The last epoch ms a datetime can show (9999-12-31T23:59:59.999Z): --at and --delay
# are kept below it, so every due time the command line writes can be printed.
MAX_WHEN_MS = 253_402_300_799_999
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _iso(ms: int) -> str:
    """ISO 8601 UTC for epoch ms; the ms themselves when a datetime cannot show them."""
    try:
        when = _EPOCH + timedelta(milliseconds=ms)  # exact, unlike a float timestamp
        return when.isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"


# -- worker --------------------------------------------------------------------------


def _load_registry(path: str) -> TaskRegistry:
    """Import ``module:attr`` (attr may be dotted) and return the registry it names.

    Raises:
        ValueError: if the path is malformed or does not name a TaskRegistry.
        ImportError: if the module cannot be imported.
    """
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"registry must be MODULE:ATTRIBUTE, got {path!r}")
    if os.getcwd() not in sys.path:  # the console script, unlike `python -m`, omits it
        sys.path.insert(0, os.getcwd())
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, TaskRegistry):
        raise ValueError(f"{path} is a {type(obj).__name__}, not a TaskRegistry")
    return obj


async def _work(args: argparse.Namespace, registry: TaskRegistry) -> int:
    client = await _connect(args.redis_url)
    metrics = None
    scheduler: Scheduler | None = None
    try:
        scheduler = Scheduler(
            client,
            args.namespace,
            shards=args.shards,
            owner_ttl=args.owner_ttl,
            check=not args.no_check,
            postgres_url=args.postgres_url,
        )
        worker = Worker(
            scheduler,
            registry,
            lookahead=args.lookahead,
            lease=args.lease,
            limit=args.limit,
            poll_interval=args.poll_interval,
            max_running=args.max_running,
            reap_interval=args.reap_interval,
            drain_timeout=args.drain_timeout,
            reconcile_interval=args.reconcile_interval,
        )
        await scheduler.open()  # fail early: unreachable, shard count mismatch
        if args.metrics_port is not None:
            from tickwheel.durable._metrics import (  # noqa: PLC0415  (optional extra)
                MetricsCollector,
                start_metrics_server,
            )

            try:
                metrics = start_metrics_server(
                    MetricsCollector(scheduler, worker), args.metrics_port
                )
            except ImportError as exc:
                raise CliError(EXIT_USAGE, f"--metrics-port: {exc}") from None
            except OSError as exc:
                raise CliError(
                    EXIT_FAILED, f"--metrics-port {args.metrics_port}: cannot listen ({exc})"
                ) from None
        loop = asyncio.get_running_loop()
        got: list[int] = []  # the signals that stopped it

        def on_signal(sig: int) -> None:
            got.append(sig)
            worker.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        started: dict[str, Any] = {"event": "started", "pid": os.getpid()}
        if metrics is not None:
            started["metrics_port"] = metrics.port
        print(json.dumps(started), flush=True)
        stats = await worker.run()
        stopped = {
            "event": "stopped",
            "stats": stats.as_dict(),
            "scheduler": scheduler.stats().as_dict(),
        }
        print(json.dumps(stopped), flush=True)
        if signal.SIGINT in got:  # Ctrl-C: the same graceful stop as SIGTERM, then 130
            print(f"tickwheel {args.command}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        return EXIT_OK
    finally:
        if metrics is not None:
            metrics.stop()
        if scheduler is not None and scheduler.pg is not None:
            await scheduler.pg.store.aclose()
        await client.aclose()


def _worker(args: argparse.Namespace) -> int:
    try:
        registry = _load_registry(args.registry)
    except (ValueError, ImportError, AttributeError) as exc:
        return _fail(args, CliError(EXIT_USAGE, f"registry: {exc}"))
    return _run(args, lambda: _work(args, registry))


# -- producers -----------------------------------------------------------------------


def _payload(text: str | None) -> Any:
    if text is None:
        return b""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(EXIT_USAGE, f"payload must be JSON, got {text!r} ({exc})") from None


def _at(text: str | None) -> int | datetime | None:
    """``--at``: epoch ms, or an ISO 8601 time with a zone (``Z`` for UTC)."""
    if text is None:
        return None
    if text.isdigit():
        ms = int(text)
        when: int | datetime = ms
    else:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            raise CliError(
                EXIT_USAGE,
                f"--at must be epoch ms or ISO 8601 (2030-01-01T09:00:00Z), got {text!r}",
            ) from None
        if when.tzinfo is None:
            raise CliError(EXIT_USAGE, f"--at needs a time zone (add Z for UTC), got {text!r}")
        ms = (when - _EPOCH) // timedelta(milliseconds=1)
    if not 0 <= ms <= MAX_WHEN_MS:
        raise CliError(
            EXIT_USAGE,
            f"--at must be between 1970-01-01T00:00:00Z and 9999-12-31T23:59:59.999Z "
            f"(epoch ms 0..{MAX_WHEN_MS}), got {text!r}",
        )
    return when


def _delay(option: str, seconds: float | None) -> float | None:
    """``--delay`` or ``--every``, checked to fall due before year 10000 (by this host's
    clock, with a day of slack for a Redis clock ahead of it)."""
    if seconds is None:
        return None
    most = (MAX_WHEN_MS - time.time() * 1000) / 1000 - 86400
    if seconds > most:
        raise CliError(
            EXIT_USAGE,
            f"{option} must fall due before year 10000 (at most {most:.0f} s), got {seconds:g}",
        )
    return seconds


def _schedule(args: argparse.Namespace) -> int:
    try:  # checked before anything is written
        payload, at = _payload(args.payload), _at(args.at)
        delay, every = _delay("--delay", args.delay), _delay("--every", args.every)
    except CliError as error:
        return _fail(args, error)

    async def body(scheduler: Scheduler) -> int:
        result = await scheduler.schedule(
            args.id,
            args.task,
            payload,
            delay=delay,
            at=at,
            replace=args.replace,
            max_attempts=args.max_attempts,
            every=every,
            cron=args.cron,
            missed=args.missed,
        )
        data = {
            "id": result.id,
            "status": result.status.name.lower(),
            "when_ms": result.when_ms,
            "due": _iso(result.when_ms),
            "shard": scheduler.keys.shard_of(args.id),
        }
        _emit(
            args,
            data,
            lambda: f"{data['status']}: job {args.id!r} (shard {data['shard']}), due {data['due']}",
        )
        refused = (ScheduleStatus.BUSY, ScheduleStatus.DONE)
        return EXIT_FAILED if result.status in refused else EXIT_OK

    return _run(args, lambda: _with_scheduler(args, body))


def _cancel(args: argparse.Namespace) -> int:
    async def body(scheduler: Scheduler) -> int:
        found = await scheduler.cancel(args.id)
        text = f"cancelled job {args.id!r}" if found else f"no job {args.id!r}"
        _emit(args, {"id": args.id, "cancelled": found}, text)
        return EXIT_OK if found else EXIT_FAILED

    def absent() -> int:
        return _not_created(args, {"id": args.id, "cancelled": False}, f"no job {args.id!r}: ")

    return _run(args, lambda: _with_scheduler(args, body, absent=absent))


# -- operators -----------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    async def body(scheduler: Scheduler) -> int:
        rows = await scheduler.inspect()
        totals = {
            name: sum(getattr(r, name) for r in rows)
            for name in ("due", "overdue", "leased", "expired", "dead")
        }
        lags = [r.lag_ms for r in rows if r.overdue]
        totals["max_lag_ms"] = max(lags, default=0)
        totals["owned"] = sum(1 for r in rows if r.owner)
        data = {
            "namespace": args.namespace,
            "created": True,
            "shards": [r.as_dict() for r in rows],
            **totals,
        }
        _emit(args, data, lambda: _inspect_text(args.namespace, rows, totals))
        return EXIT_OK

    return _run(args, lambda: _with_scheduler(args, body, absent=lambda: _not_created(args, {})))


def _inspect_text(namespace: str, rows: list[ShardInfo], totals: dict[str, int]) -> str:
    lines = [
        f"namespace {namespace!r}, {len(rows)} shards (Redis time {_iso(rows[0].now_ms)})",
        f"  {'shard':>5} {'due':>8} {'overdue':>8} {'lag':>9} {'leased':>7} {'expired':>7} "
        f"{'dead':>6} {'epoch':>6}  {'owner':<12} next due",
    ]
    for r in rows:
        owner = f"{r.owner[:12]}" if r.owner else "-"
        lag = f"{r.lag_ms / 1000:.1f}s" if r.overdue else "-"
        nxt = _iso(r.next_due_ms) if r.next_due_ms else "-"
        lines.append(
            f"  {r.shard:>5} {r.due:>8} {r.overdue:>8} {lag:>9} {r.leased:>7} "
            f"{r.expired:>7} {r.dead:>6} {r.epoch:>6}  {owner:<12} {nxt}"
        )
    lines.append(
        f"  total: {totals['due']} due ({totals['overdue']} overdue, oldest "
        f"{totals['max_lag_ms'] / 1000:.1f}s late), {totals['leased']} leased "
        f"({totals['expired']} expired), {totals['dead']} dead; "
        f"{totals['owned']}/{len(rows)} shards owned"
    )
    return "\n".join(lines)


def _dead_row(job: JobInfo) -> dict[str, Any]:
    return {
        "id": job.id,
        "shard": job.shard,
        "task": job.task,
        "payload": job.payload.decode(errors="replace")
        if isinstance(job.payload, bytes)
        else job.payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "died_ms": job.when_ms,
        "error": job.last_error,
    }


def _dead_letters(args: argparse.Namespace) -> int:
    action = f"dead-letters {args.action}"
    if args.action == "list" and (args.ids or args.all):
        bad = "job ids" if args.ids else "--all"
        return _fail(args, CliError(EXIT_USAGE, f"{action} takes no {bad} (only --shard, --limit)"))
    if args.action != "list":
        if not args.ids and not args.all:
            return _fail(args, CliError(EXIT_USAGE, f"{action}: give job ids, or --all"))
        if args.ids and args.all:
            return _fail(args, CliError(EXIT_USAGE, f"{action}: give job ids or --all, not both"))
        if args.ids and args.shard is not None:
            return _fail(
                args,
                CliError(
                    EXIT_USAGE, f"{action}: --shard goes with --all; a job id names its shard"
                ),
            )

    async def body(scheduler: Scheduler) -> int:
        shards = [args.shard] if args.shard is not None else range(scheduler.keys.shards)
        if args.action == "list":
            rows: list[dict[str, Any]] = []
            total = 0
            for shard in shards:
                page = await scheduler.dead_letters(shard, count=args.limit)
                total += page.total
                rows += [_dead_row(j) for j in page.jobs]

            def text() -> str:
                lines = [
                    f"  {r['id']}  shard {r['shard']}  task {r['task']}  attempt {r['attempt']}/"
                    f"{r['max_attempts']}  died {_iso(r['died_ms'])}  {r['error']}"
                    for r in rows
                ]
                return "\n".join([f"{total} dead letters", *lines])

            _emit(args, {"created": True, "total": total, "jobs": rows}, text)
            return EXIT_OK
        if args.ids:
            act = scheduler.requeue_dead if args.action == "requeue" else scheduler.purge_dead
            done = await act(args.ids)
            missing = [i for i in args.ids if i not in set(done)]
        else:
            done, missing = [], []
            for shard in shards:
                while True:  # a batch at a time, until the shard has none left
                    if args.action == "requeue":
                        got = await scheduler.requeue_all_dead(shard, limit=MAX_BATCH)
                    else:
                        got = await scheduler.purge_all_dead(shard, limit=MAX_BATCH)
                    done += got
                    if len(got) < MAX_BATCH:
                        break
        verb = "requeued" if args.action == "requeue" else "purged"
        said = f"{verb} {len(done)} dead letters"
        if missing:
            said += f"; not dead letters: {', '.join(missing)}"
        _emit(args, {verb: done, "missing": missing}, said)
        return EXIT_FAILED if missing else EXIT_OK

    def absent() -> int:
        if args.action == "list":
            return _not_created(args, {"total": 0, "jobs": []}, "0 dead letters: ")
        verb = "requeued" if args.action == "requeue" else "purged"
        return _not_created(args, {verb: [], "missing": list(args.ids)}, f"{verb} nothing: ")

    return _run(args, lambda: _with_scheduler(args, body, absent=absent))


def _dashboard(args: argparse.Namespace) -> int:
    check_url(args.redis_url)  # a malformed URL is a usage error, said without its password
    try:
        client_from_url(args.redis_url)  # redis-py's own checks; no connection is made
    except ValueError as exc:
        url = args.redis_url
        raise CliError(EXIT_USAGE, f"--redis-url {shown_url(url)!r}: {_hide(url, exc)}") from None
    try:
        from tickwheel.durable import _dashboard as dash  # noqa: PLC0415 (the optional extra)
    except ImportError as exc:
        raise CliError(
            EXIT_USAGE,
            f"the dashboard needs its extra: pip install 'tickwheel[dashboard]' ({exc.name})",
        ) from None
    token = os.environ.get(dash.TOKEN_ENV) or None
    if not dash.is_loopback(args.host) and token is None:
        raise CliError(
            EXIT_USAGE,
            f"--host {args.host} is not a loopback address: set ${dash.TOKEN_ENV} to a secret "
            "of your own before exposing the dashboard (reads then need it too)",
        )
    try:
        config = dash.DashboardConfig(
            args.redis_url,
            args.namespace,
            token=token or secrets.token_urlsafe(24),
            read_only=args.read_only,
            protect_reads=not dash.is_loopback(args.host),
            allowed_hosts=["127.0.0.1", "localhost", "[::1]"]
            if dash.is_loopback(args.host)
            else ["*"],
            postgres_url=args.postgres_url,
        )
        from tickwheel.durable._dashboard._data import Namespace  # noqa: PLC0415

        Namespace(args.redis_url, args.namespace)  # validates the namespace
    except (TypeError, ValueError) as exc:
        name = dash.TOKEN_ENV if "token" in str(exc) else "--namespace"
        raise CliError(EXIT_USAGE, f"{name}: {exc}") from None
    try:
        return dash.serve(config, args.host, args.port, token_given=token is not None)
    except OSError as exc:
        raise CliError(EXIT_FAILED, f"cannot listen on {args.host}:{args.port}: {exc}") from None
    except KeyboardInterrupt:
        return EXIT_OK


def _dashboard_command(args: argparse.Namespace) -> int:
    try:
        return _dashboard(args)
    except CliError as error:
        return _fail(args, error)


def _report_lines(report: ServerReport) -> list[str]:
    def show(value: object) -> str:
        return "unknown" if value is None else str(value)

    cluster = show(report.cluster_enabled)
    if report.cluster_enabled:
        cluster += f" (cluster_state {show(report.cluster_state)})"
    return [
        f"  redis_version     {report.version or 'unknown'}",
        f"  aof_enabled       {show(report.aof_enabled)}",
        f"  appendfsync       {show(report.appendfsync)}",
        f"  maxmemory-policy  {show(report.maxmemory_policy)}",
        f"  cluster_enabled   {cluster}",
        f"  a crash loses     {report.crash_loss}",
    ]


def _check(args: argparse.Namespace) -> int:
    async def body() -> int:
        try:
            client = await _connect(args.redis_url)
        except RedisUnavailable:
            # A cluster that cannot serve (slots unassigned, too many masters down)
            # refuses a cluster client; its node still answers a plain one, and the
            # report then says what is wrong with the cluster.
            client = client_from_url(args.redis_url)
            if isinstance(client, RedisCluster):
                await client.aclose()
                raise
        try:
            with warnings.catch_warnings():  # reported below, not as warnings
                warnings.simplefilter("ignore")
                report = await check_server(client)
            keys = Keys(args.namespace, args.shards, DEFAULT_BUCKETS)
            try:
                stored: Any = await client.get(keys.meta)
            except redis.exceptions.ResponseError as exc:  # e.g. a cluster that is down
                stored, unreadable = None, str(exc)
            else:
                unreadable = ""
        finally:
            await client.aclose()
        layout = _layout(stored)
        data: dict[str, Any] = {
            "url": check_url(args.redis_url),
            "version": report.version,
            "aof_enabled": report.aof_enabled,
            "appendfsync": report.appendfsync,
            "crash_loss": report.crash_loss,
            "maxmemory_policy": report.maxmemory_policy,
            "cluster_enabled": report.cluster_enabled,
            "cluster_state": report.cluster_state,
            "problems": report.problems,
            "unknown": report.unknown,
            "namespace": args.namespace,
            "namespace_shards": layout[0] if layout else None,
            "ok": report.ok,
        }
        mismatch: CliError | None = None
        if layout and layout != (keys.shards, keys.buckets):
            mismatch = _mismatch(
                args, ShardCountMismatch(args.namespace, layout, (keys.shards, keys.buckets))
            )
            data.update(error=str(mismatch), exit_code=mismatch.code)
        lines = [f"Redis at {data['url']}", *_report_lines(report)]
        if unreadable:
            lines.append(f"  namespace {args.namespace!r}: not readable ({unreadable})")
        elif layout:
            lines.append(f"  namespace {args.namespace!r}: {data['namespace_shards']} shards")
        else:
            lines.append(f"  namespace {args.namespace!r}: not created yet")
        lines += [f"  PROBLEM: {p}" for p in report.problems]
        lines += [f"  not checked: {u}" for u in report.unknown]
        lines.append("  ok" if report.ok else f"  {len(report.problems)} problem(s)")
        _emit(args, data, "\n".join(lines))
        if mismatch is not None:
            raise mismatch  # on stderr; with --json it is in the document above
        return EXIT_OK if report.ok else EXIT_FAILED

    return _run(args, body)


# -- demos ---------------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from tickwheel.durable._demo import run_demo  # noqa: PLC0415  (spawns workers)

    async def body() -> int:
        if args.redis_url is not None:
            check_url(args.redis_url)
        try:
            return await run_demo(
                args.redis_url, jobs=args.jobs, seconds=args.seconds, as_json=args.json
            )
        except RuntimeError as exc:  # no redis-server binary, a worker did not start
            raise CliError(EXIT_FAILED, str(exc)) from None

    return _run(args, body)


def _wheel_demo(args: argparse.Namespace) -> int:
    from tickwheel.durable._wheel_demo import wheel_demo  # noqa: PLC0415

    return wheel_demo(timers=args.timers, spread=args.spread, resets=args.resets, seed=args.seed)


# -- arguments -----------------------------------------------------------------------


def _whole(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise argparse.ArgumentTypeError(f"expected a number {bound}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _whole(text, 1)


def _batch(text: str) -> int:
    return _whole(text, 1, MAX_BATCH)


def _non_negative_int(text: str) -> int:
    return _whole(text, 0)


def _port(text: str) -> int:
    return _whole(text, 0, 65535)


def _finite_float(text: str, *, zero_ok: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value >= 0 if zero_ok else value > 0) or value == float("inf"):
        bound = ">= 0" if zero_ok else "> 0"
        raise argparse.ArgumentTypeError(f"expected a finite number {bound}, got {text}")
    return value


def _positive_float(text: str) -> float:
    return _finite_float(text, zero_ok=False)


def _non_negative_float(text: str) -> float:
    return _finite_float(text, zero_ok=True)


def _common(*, with_json: bool = True) -> argparse.ArgumentParser:
    """The options every Redis command takes (the worker has no ``--json``: it always
    prints its started and stopped events as JSON lines)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=os.environ.get(URL_ENV) or None,
        help=f"redis://host:port/db (default ${URL_ENV})",
    )
    common.add_argument(
        "--postgres-url",
        default=os.environ.get(PG_URL_ENV) or None,
        help=f"postgresql://...: the Postgres mode (default ${PG_URL_ENV})",
    )
    common.add_argument("--namespace", default="tickwheel", help="key namespace")
    common.add_argument(
        "--shards", type=_positive_int, default=DEFAULT_SHARDS, help="the namespace's shard count"
    )
    if with_json:
        common.add_argument("--json", action="store_true", help="print one JSON document")
    common.add_argument(
        "-v", "--verbose", action="count", default=0, help="log to stderr (-vv: debug)"
    )
    return common


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="tickwheel",
        description="Timing wheel and durable Redis scheduler.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common()

    def add(name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=text, description=text, epilog=EPILOG, formatter_class=fmt, **kwargs
        )

    demo = add("demo", "wheel timers and durable jobs on an embedded Redis, a worker killed")
    demo.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    demo.add_argument("--jobs", type=_positive_int, default=2000, help="durable one-shot jobs")
    demo.add_argument("--seconds", type=_positive_float, default=12.0, help="how long it runs")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr")
    demo.set_defaults(func=_demo, needs_url=False)

    wdemo = add("wheel-demo", "the timing wheel beside asyncio's own timers, in memory")
    wdemo.add_argument("--timers", type=_positive_int, default=100_000, help="how many timers")
    wdemo.add_argument(
        "--spread", type=_positive_float, default=1.0, help="seconds over which they fall due"
    )
    wdemo.add_argument(
        "--resets", type=_non_negative_int, default=20_000, help="how many are reset once"
    )
    wdemo.add_argument("--seed", type=int, default=1, help="random seed")
    wdemo.set_defaults(func=_wheel_demo, needs_url=False)

    work = add(
        "worker",
        "run durable jobs with the tasks of a registry (prints JSON lines: started, stopped)",
        parents=[_common(with_json=False)],
    )
    work.add_argument("registry", help="MODULE:ATTRIBUTE naming a TaskRegistry")
    work.add_argument("--owner-ttl", type=_positive_float, default=DEFAULT_OWNER_TTL)
    work.add_argument("--lookahead", type=_non_negative_float, default=DEFAULT_LOOKAHEAD)
    work.add_argument("--lease", type=_positive_float, default=DEFAULT_LEASE)
    work.add_argument("--limit", type=_positive_int, default=DEFAULT_LIMIT)
    work.add_argument("--max-running", type=_positive_int, default=DEFAULT_MAX_RUNNING)
    work.add_argument("--poll-interval", type=_positive_float, default=DEFAULT_POLL_INTERVAL)
    work.add_argument("--reap-interval", type=_positive_float, default=DEFAULT_REAP_INTERVAL)
    work.add_argument("--drain-timeout", type=_non_negative_float, default=DEFAULT_DRAIN_TIMEOUT)
    work.add_argument(
        "--reconcile-interval",
        type=_positive_float,
        default=DEFAULT_RECONCILE_INTERVAL,
        help="Postgres mode: seconds between reconciles (one runs at start)",
    )
    work.add_argument("--no-check", action="store_true", help="skip the server config check")
    work.add_argument(
        "--metrics-port",
        type=_port,
        help="serve Prometheus metrics on 127.0.0.1:PORT (needs tickwheel[prometheus])",
    )
    work.set_defaults(func=_worker)

    sched = add("schedule", "schedule a durable job", parents=[common])
    sched.add_argument("id", help="the job id (scheduling it again keeps the first)")
    sched.add_argument("task", help="the task name")
    sched.add_argument("payload", nargs="?", help="the payload, as JSON")
    when = sched.add_mutually_exclusive_group()
    when.add_argument("--delay", type=_non_negative_float, help="seconds from Redis's now")
    when.add_argument("--at", help="epoch ms, or ISO 8601 with a zone")
    rec = sched.add_mutually_exclusive_group()
    rec.add_argument("--every", type=_positive_float, help="recur every this many seconds")
    rec.add_argument("--cron", help="recur on a cron expression (UTC)")
    sched.add_argument(
        "--missed",
        choices=[m.value for m in MissedRun],
        default=MissedRun.ONCE.value,
        help="missed-run policy of a recurring job",
    )
    sched.add_argument("--replace", action="store_true", help="overwrite a due or dead job")
    sched.add_argument("--max-attempts", type=_positive_int, default=DEFAULT_MAX_ATTEMPTS)
    sched.set_defaults(func=_schedule)

    cancel = add("cancel", "remove a job in any state", parents=[common])
    cancel.add_argument("id", help="the job id")
    cancel.set_defaults(func=_cancel)

    insp = add("inspect", "per shard: due, overdue and lag, leased, dead, owner", parents=[common])
    insp.set_defaults(func=_inspect)

    dead = add("dead-letters", "list, requeue or purge dead letters", parents=[common])
    dead.add_argument("action", choices=["list", "requeue", "purge"])
    dead.add_argument("ids", nargs="*", help="job ids (requeue, purge)")
    dead.add_argument("--all", action="store_true", help="requeue or purge every dead letter")
    dead.add_argument("--shard", type=_non_negative_int, help="only this shard")
    dead.add_argument(
        "--limit",
        type=_batch,
        default=100,
        help=f"list: at most this many per shard (1..{MAX_BATCH})",
    )
    dead.set_defaults(func=_dead_letters)

    dash = add("dashboard", "serve a web UI and JSON API over a namespace (tickwheel[dashboard])")
    dash.add_argument(
        "--redis-url",
        default=os.environ.get(URL_ENV) or None,
        help=f"redis://host:port/db (default ${URL_ENV})",
    )
    dash.add_argument("--namespace", default="tickwheel", help="key namespace")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    dash.add_argument("--port", type=_port, default=8765, help="port (0: a free one)")
    dash.add_argument("--read-only", action="store_true", help="refuse every write")
    dash.add_argument(
        "--postgres-url",
        default=os.environ.get(PG_URL_ENV) or None,
        help=f"the Postgres mode's PostgreSQL (default ${PG_URL_ENV})",
    )
    dash.add_argument(
        "-v", "--verbose", action="count", default=0, help="log to stderr (-vv: debug)"
    )
    dash.set_defaults(func=_dashboard_command)

    chk = add("check", "is the server fit for durable jobs?", parents=[common])
    chk.set_defaults(func=_check)

    pg = add(
        "pg",
        "PostgreSQL of the Postgres mode: migrate the schema, show its version, or prune "
        "done rows older than --older-than seconds",
    )
    pg.add_argument("action", choices=["migrate", "status", "prune"])
    pg.add_argument(
        "--older-than",
        type=_non_negative_float,
        default=7 * 86400.0,
        help="prune: seconds a done row is kept (default 7 days)",
    )
    pg.add_argument(
        "--postgres-url",
        default=os.environ.get(PG_URL_ENV) or None,
        help=f"postgresql://user@host:port/db (default ${PG_URL_ENV})",
    )
    pg.add_argument("--json", action="store_true", help="print one JSON document")
    pg.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr")
    pg.set_defaults(func=_pg, needs_url=False)

    rec_cmd = add(
        "reconcile",
        "rebuild the Redis index from PostgreSQL (after Redis lost data; safe to repeat)",
        parents=[common],
    )
    rec_cmd.set_defaults(func=_reconcile)
    return parser


# -- Postgres mode -------------------------------------------------------------------


def _pg(args: argparse.Namespace) -> int:
    if not args.postgres_url:
        return _fail(
            args, CliError(EXIT_USAGE, f"--postgres-url is required (or set {PG_URL_ENV})")
        )

    async def body() -> int:
        from tickwheel.durable.postgres import (  # noqa: PLC0415  (optional extra)
            SCHEMA_VERSION,
            check_schema,
            migrate,
            schema_version,
        )
        from tickwheel.durable.postgres._store import translate  # noqa: PLC0415

        try:
            import asyncpg  # noqa: PLC0415

            conn = await asyncpg.connect(args.postgres_url, timeout=10)
        except ImportError as exc:
            raise CliError(
                EXIT_USAGE, f"needs asyncpg: pip install 'tickwheel[postgres]' ({exc})"
            ) from None
        except Exception as exc:
            err = translate(exc)
            raise (
                err
                if isinstance(err, PostgresUnavailable)
                else CliError(EXIT_USAGE, f"--postgres-url: {type(exc).__name__}: {exc}")
            ) from None
        try:
            if args.action == "prune":
                from tickwheel.durable.postgres._store import prune  # noqa: PLC0415

                await check_schema(conn)
                done, jobs = await prune(conn, args.older_than)
                _emit(
                    args,
                    {"done_deleted": done, "jobs_deleted": jobs},
                    f"deleted {done} done rows and {jobs} completed job rows",
                )
                return EXIT_OK
            applied = await migrate(conn) if args.action == "migrate" else []
            version = await schema_version(conn)
        finally:
            await conn.close()
        data = {"applied": applied, "version": version, "wanted": SCHEMA_VERSION}
        if args.action == "migrate":
            text = (
                f"applied migrations {applied}; schema version {version}"
                if applied
                else f"schema is current (version {version})"
            )
        else:
            text = f"schema version {version}; this tickwheel needs {SCHEMA_VERSION}"
        _emit(args, data, text)
        return EXIT_OK if version >= SCHEMA_VERSION else EXIT_FAILED

    return _run(args, body)


def _reconcile(args: argparse.Namespace) -> int:
    if not args.postgres_url:
        return _fail(
            args, CliError(EXIT_USAGE, f"--postgres-url is required (or set {PG_URL_ENV})")
        )

    async def body(scheduler: Scheduler) -> int:
        result = await scheduler.reconcile()
        data = dataclasses.asdict(result)
        _emit(
            args,
            data,
            f"{result.pending} pending jobs in PostgreSQL, {result.restored} written back to "
            f"Redis, {result.epochs_raised} shard epochs raised, {result.relayed} outbox rows "
            f"relayed, in {result.seconds:.3f} s",
        )
        return EXIT_OK

    return _run(args, lambda: _with_scheduler(args, body))


def _configure_logging(verbose: int) -> None:
    if verbose <= 0:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tickwheel")
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (see the module docstring).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if getattr(args, "needs_url", True) and not args.redis_url:
        parser.error(f"{args.command}: --redis-url is required (or set {URL_ENV})")
    if getattr(args, "shard", None) is not None and args.shard >= args.shards:
        parser.error(f"--shard must be below --shards {args.shards}, got {args.shard}")
    _configure_logging(getattr(args, "verbose", 0))
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
