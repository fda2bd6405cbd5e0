"""What every command shares: exit codes, the Redis client, errors to exit codes, output."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys
import unicodedata
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tickwheel.durable.model import (
    DurableError,
    PostgresModeRequired,
    PostgresUnavailable,
    RedisConfigError,
    RedisUnavailable,
    SchemaNotReady,
    ServerCheckFailed,
    ShardCountMismatch,
)
from tickwheel.durable.scheduler import (
    Scheduler,
)
from tickwheel.durable.store import (
    DEFAULT_BUCKETS,
    NO_REPLY_ERRORS,
    REDIS_ERRORS,
    URL_ENV,
    Client,
    Keys,
    connect,
    error_reply,
    hide_secrets,
    parse_nodes,
    read_layout,
    shown_url,
    split_url,
    unwrap,
    url_error,
)

EXIT_OK = 0


EXIT_FAILED = 1


EXIT_USAGE = 2


EXIT_UNREACHABLE = 3


EXIT_MISMATCH = 4


EXIT_PG_UNREACHABLE = 5


# The Postgres mode's DSN, when --postgres-url is not given.
PG_URL_ENV = "TICKWHEEL_POSTGRES_URL"


EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT


logger = logging.getLogger("tickwheel.durable")


class CliError(Exception):
    """A failure the command reports in one sentence (no traceback) with its exit code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code  # the exit code


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
            f"--redis-url: {hide_password(url, exc)} (for example redis://127.0.0.1:6379/0, or "
            "redis+cluster://host:port,host:port for a Redis Cluster)",
        ) from None
    db = rest.partition("?")[0].strip("/")
    if db and not digits(db):
        raise CliError(
            EXIT_USAGE, url_error(f"--redis-url database must be a number, got {db!r}", url)
        )
    return ",".join(f"{h}:{p}" for h, p in nodes)


async def connect_redis(url: str) -> Client:
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
        raise CliError(
            EXIT_USAGE, f"--redis-url {shown_url(url)!r}: {hide_password(url, exc)}"
        ) from None


def hide_password(url: str, exc: BaseException) -> str:
    """The message of an error about a malformed ``url`` without its credentials (nor a
    piece of one: ``store.url_error``)."""
    return url_error(str(exc), url) if isinstance(url, str) else str(exc)


def digits(text: str) -> bool:
    """Is ``text`` ASCII digits only (``str.isdigit`` also takes "²", which ``int``
    refuses)."""
    return text.isascii() and text.isdigit()


def terminal(text: object, *, lines: bool = False) -> str:
    """``text`` safe to print on a terminal: control and format characters (escape
    sequences, carriage returns, bidi overrides) escaped as ``\\x1b``, ``\\u202e``;
    newlines too unless ``lines`` (a text of several lines made here)."""
    out = []
    for ch in str(text):
        if (ch == "\n" and lines) or unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp"):
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def unreachable(url: str, exc: BaseException) -> CliError:
    where = check_url(url)
    # The library's message starts "cannot reach Redis at URL: "; said once here.
    reason = re.sub(
        r"^(redis unavailable: )?cannot reach Redis at \S+: ", "", hide_secrets(str(exc), url)
    )
    return CliError(
        EXIT_UNREACHABLE,
        f"cannot reach Redis at {where} ({reason}). Check that redis-server runs there "
        "and accepts connections from this host (bind address, port, firewall, password), "
        f"or pass another --redis-url (or set {URL_ENV}).",
    )


def shard_mismatch(args: argparse.Namespace, exc: ShardCountMismatch) -> CliError:
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


def emit(args: argparse.Namespace, data: Any, text: str | Callable[[], str]) -> None:
    """Print ``data`` as JSON with ``--json``, else ``text`` (made only then, when a
    callable)."""
    if getattr(args, "json", False):
        print(json.dumps(data, default=str), flush=True)
        args.emitted = True  # the one JSON document: an error after it is on stderr only
    else:
        print(terminal(text() if callable(text) else text, lines=True), flush=True)


def fail(args: argparse.Namespace, error: CliError) -> int:
    """Report ``error`` on stderr (and as the one JSON document under ``--json``), without
    a credential of the command's URLs; return its exit code."""
    message = hide_secrets(
        str(error), getattr(args, "redis_url", None), getattr(args, "postgres_url", None)
    )
    print(f"tickwheel {args.command}: {terminal(message)}", file=sys.stderr)
    if getattr(args, "json", False) and not getattr(args, "emitted", False):
        print(json.dumps({"error": message, "exit_code": error.code}), flush=True)
        args.emitted = True
    return error.code


def run(args: argparse.Namespace, body: Callable[[], Awaitable[int]]) -> int:
    """Run an async command body and turn the errors a person acts on into exit codes."""
    try:
        return asyncio.run(_guarded(args, body))
    except CliError as error:
        return fail(args, error)
    except KeyboardInterrupt:
        print(f"tickwheel {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


async def _guarded(args: argparse.Namespace, body: Callable[[], Awaitable[int]]) -> int:
    url = getattr(args, "redis_url", None)
    try:
        return await body()
    except ShardCountMismatch as exc:
        raise shard_mismatch(args, exc) from None
    except (RedisUnavailable, *NO_REPLY_ERRORS) as e:
        refusal = _refusal(e)
        if refusal is not None:  # it answered: with an error reply, not "unreachable"
            raise refusal from None
        raise unreachable(url or "", e) from None
    except ServerCheckFailed as exc:
        raise CliError(EXIT_FAILED, f"the server may lose jobs: {exc}") from None
    except (RedisConfigError, PostgresModeRequired) as exc:  # permanent: fix the command
        raise CliError(EXIT_USAGE, str(exc)) from None
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
    except REDIS_ERRORS as exc:
        # An error reply (OOM at maxmemory, WRONGTYPE, NOPERM, a cluster that is down):
        # the command reached Redis, which refused it.
        exc = unwrap(exc)
        raise CliError(
            EXIT_FAILED, f"Redis refused the command: {type(exc).__name__}: {exc}"
        ) from None


def _refusal(exc: BaseException) -> CliError | None:
    """For a RedisUnavailable made of an error reply (the library may class OOM, LOADING,
    BUSY, NOREPLICAS as transient): that reply, as exit 1; else None."""
    reply = error_reply(exc) if isinstance(exc, RedisUnavailable) else None
    if reply is None:
        return None
    return CliError(EXIT_FAILED, f"Redis refused the command: {type(reply).__name__}: {reply}")


async def with_scheduler(
    args: argparse.Namespace,
    fn: Callable[[Scheduler], Awaitable[int]],
    *,
    absent: Callable[[], int] | None = None,
) -> int:
    """Open a scheduler on the command's URL, namespace and shard count; run ``fn``.

    The namespace's stored layout is read first (``store.read_layout``: one GET, no
    write): a namespace that exists is opened with its stored bucket count; one that
    does not is created (its layout stored) only when ``absent`` is None, else
    ``absent()`` runs instead and nothing is written.
    """
    client = await connect_redis(args.redis_url)
    try:
        Keys(args.namespace, args.shards)  # a bad name or count is refused before a read
        postgres = getattr(args, "postgres_url", None) is not None
        stored = await read_layout(client, args.namespace, postgres=postgres)
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


def not_created(args: argparse.Namespace, data: dict[str, Any], what: str = "") -> int:
    """Report a namespace that does not exist (nothing was written): exit 1."""
    text = (
        f"namespace {args.namespace!r} not created: nothing was ever scheduled in it "
        "(check --namespace and --redis-url)"
    )
    emit(args, {"namespace": args.namespace, "created": False, **data}, what + text)
    return EXIT_FAILED


# The last epoch ms a datetime can show (9999-12-31T23:59:59.999Z): --at and --delay
# are kept below it, so every due time the command line writes can be printed.
MAX_WHEN_MS = 253_402_300_799_999


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso(ms: int) -> str:
    """ISO 8601 UTC for epoch ms; the ms themselves when a datetime cannot show them."""
    try:
        when = EPOCH + timedelta(milliseconds=ms)  # exact, unlike a float timestamp
        return when.isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms"
