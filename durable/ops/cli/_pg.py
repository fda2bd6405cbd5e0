"""The Postgres mode's commands: ``pg migrate|status|prune`` and ``reconcile``."""

from __future__ import annotations

import argparse
import dataclasses
import os

from tickwheel.durable.model import (
    PostgresUnavailable,
)
from tickwheel.durable.scheduler import (
    Scheduler,
)
from tickwheel.durable.store import url_error

from ._args import (
    AddCommand,
    non_negative_float,
)
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    PG_URL_ENV,
    CliError,
    emit,
    fail,
    run,
    with_scheduler,
)


def _pg(args: argparse.Namespace) -> int:
    if not args.postgres_url:
        return fail(args, CliError(EXIT_USAGE, f"--postgres-url is required (or set {PG_URL_ENV})"))

    async def body() -> int:
        from tickwheel.durable.postgres import (  # noqa: PLC0415  (optional extra)
            SCHEMA_VERSION,
            check_schema,
            migrate,
            schema_version,
            translate,
        )

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
                else CliError(
                    EXIT_USAGE,
                    f"--postgres-url: {type(exc).__name__}: "
                    f"{url_error(str(exc), args.postgres_url)}",
                )
            ) from None
        try:
            if args.action == "prune":
                from tickwheel.durable.postgres import prune  # noqa: PLC0415

                await check_schema(conn)
                done, jobs = await prune(conn, args.older_than)
                emit(
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
        emit(args, data, text)
        return EXIT_OK if version >= SCHEMA_VERSION else EXIT_FAILED

    return run(args, body)


def _reconcile(args: argparse.Namespace) -> int:
    if not args.postgres_url:
        return fail(args, CliError(EXIT_USAGE, f"--postgres-url is required (or set {PG_URL_ENV})"))

    async def body(scheduler: Scheduler) -> int:
        result = await scheduler.reconcile()
        data = dataclasses.asdict(result)
        emit(
            args,
            data,
            f"{result.pending} pending jobs in PostgreSQL, {result.restored} written back to "
            f"Redis, {result.epochs_raised} shard epochs raised, {result.relayed} outbox rows "
            f"relayed, {result.paused} pauses written back, in {result.seconds:.3f} s",
        )
        return EXIT_OK

    return run(args, lambda: with_scheduler(args, body))


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add this group's commands (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    pg = add(
        "pg",
        "PostgreSQL of the Postgres mode: migrate the schema, show its version, or prune "
        "done rows older than --older-than seconds",
    )
    pg.add_argument("action", choices=["migrate", "status", "prune"])
    pg.add_argument(
        "--older-than",
        type=non_negative_float,
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
