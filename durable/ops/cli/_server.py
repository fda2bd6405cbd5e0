"""The server commands: ``check`` (is Redis fit for durable jobs?) and ``dashboard``."""

from __future__ import annotations

import argparse
import os
import secrets
import warnings
from typing import Any

from tickwheel.durable.model import (
    RedisUnavailable,
    ShardCountMismatch,
)
from tickwheel.durable.store import (
    DEFAULT_BUCKETS,
    REDIS_ERRORS,
    URL_ENV,
    Client,
    Keys,
    LayoutUnreadable,
    ServerReport,
    check_server,
    client_from_url,
    error_reply,
    is_cluster,
    read_layout,
    shown_url,
)

from ._args import (
    AddCommand,
    non_negative_float,
    port,
    positive_float,
)
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PG_URL_ENV,
    CliError,
    check_url,
    connect_redis,
    emit,
    fail,
    hide_password,
    iso,
    run,
    shard_mismatch,
)

# The default of --max-clock-skew; durable/postgres/_clock.py's (not imported from there:
# the command line imports the PostgreSQL code only with --postgres-url).
DEFAULT_MAX_SKEW_MS = 50.0


def _dashboard(args: argparse.Namespace) -> int:
    check_url(args.redis_url)  # a malformed URL is a usage error, said without its password
    try:
        client_from_url(args.redis_url)  # redis-py's own checks; no connection is made
    except ValueError as exc:
        url = args.redis_url
        raise CliError(
            EXIT_USAGE, f"--redis-url {shown_url(url)!r}: {hide_password(url, exc)}"
        ) from None
    try:
        from tickwheel.durable.ops import dashboard as dash  # noqa: PLC0415 (the optional extra)
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
            session_ttl=args.session_ttl,
        )
        from tickwheel.durable.ops.dashboard._namespace import Namespace  # noqa: PLC0415

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
        return fail(args, error)


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
            client = await connect_redis(args.redis_url)
        except RedisUnavailable:
            # A cluster that cannot serve (slots unassigned, too many masters down)
            # refuses a cluster client; its node still answers a plain one, and the
            # report then says what is wrong with the cluster.
            client = client_from_url(args.redis_url)
            if is_cluster(client):
                await client.aclose()
                raise
        try:
            with warnings.catch_warnings():  # reported below, not as warnings
                warnings.simplefilter("ignore")
                report = await check_server(client)
            keys = Keys(args.namespace, args.shards, DEFAULT_BUCKETS)
            layout, unreadable = await _layout(client, args.namespace)
            # The pause state of record (one HGETALL): task ("" = all) -> since (ms).
            paused: dict[Any, Any] = await client.hgetall(keys.paused) if layout else {}
            skew = await _skew(args, client)
        finally:
            await client.aclose()
        problems = list(report.problems)
        if skew is not None and skew.worst_ms > args.max_clock_skew:
            problems.append(
                f"PostgreSQL's clock is {skew.offset_ms:+.1f} ms (+/- {skew.bound_ms:.1f}) off"
                f" Redis's, over --max-clock-skew {args.max_clock_skew:g} ms: a delay is"
                " decided on PostgreSQL's clock and fires on Redis's (keep both on NTP)"
            )
        data: dict[str, Any] = {
            "url": check_url(args.redis_url),
            "version": report.version,
            "aof_enabled": report.aof_enabled,
            "appendfsync": report.appendfsync,
            "crash_loss": report.crash_loss,
            "maxmemory_policy": report.maxmemory_policy,
            "cluster_enabled": report.cluster_enabled,
            "cluster_state": report.cluster_state,
            "problems": problems,
            "unknown": report.unknown,
            "namespace": args.namespace,
            "namespace_shards": layout[0] if layout else None,
            "paused": [
                {"task": bytes(t).decode(errors="replace") or None, "since_ms": int(v)}
                for t, v in sorted(paused.items())
            ],
            "ok": not problems,
        }
        if skew is not None:  # PostgreSQL minus Redis (docs/postgres.md, "One clock")
            data["clock_skew"] = {
                "offset_ms": round(skew.offset_ms, 3),
                "bound_ms": round(skew.bound_ms, 3),
                "max_ms": args.max_clock_skew,
            }
        mismatch: CliError | None = None
        if layout and layout != (keys.shards, keys.buckets):
            mismatch = shard_mismatch(
                args, ShardCountMismatch(args.namespace, layout, (keys.shards, keys.buckets))
            )
            data.update(error=str(mismatch), exit_code=mismatch.code)
        lines = [f"Redis at {data['url']}", *_report_lines(report)]
        if unreadable:
            lines.append(f"  namespace {args.namespace!r}: not readable ({unreadable})")
        elif layout:
            lines.append(f"  namespace {args.namespace!r}: {data['namespace_shards']} shards")
            for row in data["paused"]:
                what = f"task {row['task']!r}" if row["task"] else "the whole namespace"
                lines.append(f"  paused: {what} since {iso(row['since_ms'])}")
        else:
            lines.append(f"  namespace {args.namespace!r}: not created yet")
        if skew is not None:
            lines.append(
                f"  clock skew        PostgreSQL {skew.offset_ms:+.1f} ms (+/- {skew.bound_ms:.1f})"
                " against Redis"
            )
        lines += [f"  PROBLEM: {p}" for p in problems]
        lines += [f"  not checked: {u}" for u in report.unknown]
        lines.append(f"  {len(problems)} problem(s)" if problems else "  ok")
        emit(args, data, "\n".join(lines))
        if mismatch is not None:
            raise mismatch  # on stderr; with --json it is in the document above
        return EXIT_FAILED if problems else EXIT_OK

    return run(args, body)


async def _skew(args: argparse.Namespace, client: Client) -> Any:
    """With ``--postgres-url``: the skew of PostgreSQL's clock against Redis's
    (``postgres._clock``; the driver imported only then), else None."""
    if getattr(args, "postgres_url", None) is None:
        return None
    from tickwheel.durable.postgres import pg_redis_skew  # noqa: PLC0415

    return await pg_redis_skew(args.postgres_url, client)


async def _layout(client: Client, namespace: str) -> tuple[tuple[int, int] | None, str]:
    """The namespace's stored layout (None: not created), or why it cannot be read: its
    key holds something else, or Redis refused the read (a cluster that is down)."""
    try:
        return await read_layout(client, namespace), ""
    except LayoutUnreadable as exc:
        return None, str(exc)
    except (RedisUnavailable, *REDIS_ERRORS) as exc:
        reply = error_reply(exc)  # None: no reply came, so Redis is unreachable
        if reply is None:
            raise
        return None, str(reply)


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add this group's commands (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    dash = add("dashboard", "serve a web UI and JSON API over a namespace (tickwheel[dashboard])")
    dash.add_argument(
        "--redis-url",
        default=os.environ.get(URL_ENV) or None,
        help=f"redis://host:port/db (default ${URL_ENV})",
    )
    dash.add_argument("--namespace", default="tickwheel", help="key namespace")
    dash.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    dash.add_argument("--port", type=port, default=8765, help="port (0: a free one)")
    dash.add_argument("--read-only", action="store_true", help="refuse every write")
    dash.add_argument(
        "--session-ttl",
        type=positive_float,
        default=12 * 3600.0,
        metavar="SECONDS",
        help="how long a login session lasts (default 43200: 12 h)",
    )
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
    chk.add_argument(
        "--max-clock-skew",
        type=non_negative_float,
        default=DEFAULT_MAX_SKEW_MS,
        metavar="MS",
        help="with --postgres-url: the skew of PostgreSQL's clock against Redis's that is"
        f" a problem past this (default {DEFAULT_MAX_SKEW_MS:g} ms)",
    )
    chk.set_defaults(func=_check)
