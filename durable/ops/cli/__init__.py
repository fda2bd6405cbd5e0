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
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tickwheel.durable.ops.logs import configure_logging
from tickwheel.durable.store import URL_ENV, hide_secrets

from . import _demos, _jobs, _pause, _pg, _server, _worker
from ._args import common_options
from ._common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_MISMATCH,
    EXIT_OK,
    EXIT_PG_UNREACHABLE,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    PG_URL_ENV,
    CliError,
    fail,
    terminal,
)

logger = logging.getLogger("tickwheel.durable")

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

--redis-url defaults to $TICKWHEEL_REDIS_URL, --postgres-url to $TICKWHEEL_POSTGRES_URL:
set those rather than write a password on the command line, where `ps` shows it.
--json prints one JSON document on stdout (errors included).
"""


class _UsageError(Exception):
    """An argparse refusal, raised (not exited on) so that ``main`` can report it."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser  # the (sub)command's parser, for its usage line


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors ``main`` reports (one JSON document under
    ``--json``); its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="tickwheel",
        description="Timing wheel and durable Redis scheduler.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_options()

    def add(name: str, text: str, **kwargs: Any) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=text, description=text, epilog=EPILOG, formatter_class=fmt, **kwargs
        )

    for group in (_demos, _worker, _jobs, _pause, _server, _pg):
        group.add_commands(add, common)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    """``-v`` logs INFO to stderr, ``-vv`` DEBUG. The worker's ``-v`` is DEBUG already
    (each job's claim, start and ack), and its ``--log-format json`` alone turns on INFO
    lines as JSON."""
    verbose: int = getattr(args, "verbose", 0)
    fmt: str | None = getattr(args, "log_format", None)
    if verbose <= 0 and fmt is None:
        return
    worker = args.command == "worker"
    level = logging.DEBUG if verbose > 1 or (worker and verbose) else logging.INFO
    configure_logging(level, fmt or "text", sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments (``sys.argv[1:]`` when None).

    Returns:
        The exit code (see the module docstring).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        if getattr(args, "needs_url", True) and not args.redis_url:
            parser.error(f"{args.command}: --redis-url is required (or set {URL_ENV})")
        if getattr(args, "shard", None) is not None and args.shard >= args.shards:
            parser.error(f"--shard must be below --shards {args.shards}, got {args.shard}")
    except _UsageError as exc:
        return _usage_error(exc, argv)
    _configure_logging(args)
    try:
        result: int = args.func(args)
    except CliError as error:
        return fail(args, error)
    except (RecursionError, MemoryError, ValueError, TypeError) as exc:
        # An input the command's checks let through: one sentence, no traceback.
        logger.debug("tickwheel %s failed", args.command, exc_info=True)
        return fail(args, CliError(EXIT_USAGE, f"{type(exc).__name__}: {exc}"))
    return result


def _usage_error(exc: _UsageError, argv: list[str]) -> int:
    """An argparse refusal: usage and message on stderr, and under ``--json`` (the flag
    given anywhere: the parse failed) one JSON document on stdout; exit 2."""
    message = hide_secrets(str(exc), *_urls_in(argv))
    exc.parser.print_usage(sys.stderr)
    print(f"{exc.parser.prog}: error: {terminal(message)}", file=sys.stderr)
    if "--json" in argv:
        print(json.dumps({"error": message, "exit_code": EXIT_USAGE}), flush=True)
    return EXIT_USAGE


def _urls_in(argv: list[str]) -> list[str]:
    """The values of the URL options in ``argv`` (their credentials are never shown)."""
    urls = [os.environ.get(URL_ENV), os.environ.get(PG_URL_ENV)]
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if name in ("--redis-url", "--postgres-url"):
            urls.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else None))
    return [u for u in urls if u]
