"""The job commands: ``schedule``, ``cancel``, ``inspect`` and ``dead-letters``."""

from __future__ import annotations

import argparse
from typing import Any

from tickwheel.durable.model import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_PRIORITY,
    CancelResult,
    JobInfo,
    JobSpec,
    MissedRun,
    ScheduleStatus,
    ShardInfo,
    UndecodablePayload,
    check_key,
)
from tickwheel.durable.scheduler import (
    MAX_BATCH,
    Scheduler,
)
from tickwheel.durable.store import task_growth

from ._args import (
    AddCommand,
    at_time,
    batch_size,
    delay_seconds,
    json_payload,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from ._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    emit,
    fail,
    iso,
    not_created,
    run,
    terminal,
    with_scheduler,
)
from ._limits import inspect_key
from ._pause import paused_rows


def _schedule(args: argparse.Namespace) -> int:
    try:  # checked before anything is written
        payload, at = json_payload(args.payload), at_time(args.at)
        delay, every = delay_seconds("--delay", args.delay), delay_seconds("--every", args.every)
        if args.tz is not None or args.jitter is not None:
            # A bad zone or jitter, or one without --cron/--every: before connecting.
            try:
                Scheduler.recurrence(every=every, cron=args.cron, tz=args.tz, jitter=args.jitter)
            except (TypeError, ValueError) as exc:
                raise CliError(EXIT_USAGE, f"--{exc}") from exc
        flow = {"debounce": args.debounce, "max_wait": args.max_wait, "throttle": args.throttle}
        if any(v is not None for v in flow.values()):
            if every is not None or args.cron is not None:
                raise CliError(EXIT_USAGE, "--debounce/--throttle apply to one-shot jobs")
            try:
                JobSpec(args.id, args.task, delay=delay, at=at, **flow)
            except (TypeError, ValueError) as exc:
                raise CliError(EXIT_USAGE, f"--{exc}") from exc
        if args.key is not None:
            try:
                check_key(args.key)
            except ValueError as exc:
                raise CliError(EXIT_USAGE, f"--{exc}") from exc
    except CliError as error:
        return fail(args, error)

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
            tz=args.tz,
            missed=args.missed,
            jitter=args.jitter,
            timeout=args.timeout,
            key=args.key,
            priority=args.priority,
            **flow,
        )
        data = {
            "id": result.id,
            "status": result.status.name.lower(),
            "when_ms": result.when_ms,
            "due": iso(result.when_ms),
            "shard": scheduler.keys.shard_of(args.id),
        }
        emit(
            args,
            data,
            lambda: f"{data['status']}: job {args.id!r} (shard {data['shard']}), due {data['due']}",
        )
        refused = (ScheduleStatus.BUSY, ScheduleStatus.DONE)
        return EXIT_FAILED if result.status in refused else EXIT_OK

    return run(args, lambda: with_scheduler(args, body))


def _cancel(args: argparse.Namespace) -> int:
    async def body(scheduler: Scheduler) -> int:
        result = await scheduler.cancel_job(args.id)
        found = result is not CancelResult.NOT_FOUND
        if result is CancelResult.STOPPED:
            text = f"cancelled job {args.id!r} (it was running: its worker stops it)"
        else:
            text = f"cancelled job {args.id!r}" if found else f"no job {args.id!r}"
        emit(args, {"id": args.id, "cancelled": found, "result": result.value}, text)
        return EXIT_OK if found else EXIT_FAILED

    def absent() -> int:
        doc = {"id": args.id, "cancelled": False, "result": CancelResult.NOT_FOUND.value}
        return not_created(args, doc, f"no job {args.id!r}: ")

    return run(args, lambda: with_scheduler(args, body, absent=absent))


def _inspect(args: argparse.Namespace) -> int:
    if args.job is not None:
        return _inspect_job(args)
    if args.key is not None:
        return inspect_key(args)

    async def body(scheduler: Scheduler) -> int:
        rows = await scheduler.inspect()
        totals = {
            name: sum(getattr(r, name) for r in rows)
            for name in ("due", "overdue", "leased", "expired", "dead", "parked", "waiting")
        }
        paused = paused_rows(await scheduler.paused())
        # Shards whose copy of the pause state differs from the state of record: a
        # pause or resume cut short (re-run it to finish it).
        record = sorted(str(row["task"] or "") for row in paused)
        unsettled = [r.shard for r in rows if sorted(r.paused) != record]
        lags = [r.lag_ms for r in rows if r.overdue]
        totals["max_lag_ms"] = max(lags, default=0)
        totals["owned"] = sum(1 for r in rows if r.owner)
        tasks = await _task_window(scheduler, max(r.now_ms for r in rows))
        data = {
            "namespace": args.namespace,
            "created": True,
            "shards": [r.as_dict() for r in rows],
            **totals,
            "paused": paused,
            "pause_unsettled_shards": unsettled,
            "tasks": tasks,
        }

        def text() -> str:
            lines = [_inspect_text(args.namespace, rows, totals)]
            for row in paused:
                what = f"task {row['task']!r}" if row["task"] else "the whole namespace"
                lines.append(f"  paused: {what} since {row['since']}")
            if unsettled:
                lines.append(
                    f"  WARNING: shards {unsettled} hold another pause state: a pause or "
                    "resume was cut short; run it again"
                )
            if totals["parked"]:
                lines.append(f"  {totals['parked']} due jobs of paused tasks wait for a resume")
            if totals["waiting"]:
                lines.append(
                    f"  {totals['waiting']} jobs wait for a permit of their flow key "
                    "(not in due: docs/limits.md)"
                )
            for task, t in sorted(tasks.items()):
                lines.append(
                    f"  task {task or '(other tasks)'!r}, last {TASK_WINDOW_S // 60} min:"
                    f" {t['runs']} run(s), {t['acked']} acked, {t['retries']} retried,"
                    f" {t['dead']} dead"
                )
            return "\n".join(lines)

        emit(args, data, text)
        return EXIT_OK

    return run(args, lambda: with_scheduler(args, body, absent=lambda: not_created(args, {})))


# inspect: the window (s) of the counters per task, from the workers' chart samples.
TASK_WINDOW_S = 300


async def _task_window(scheduler: Scheduler, now_ms: int) -> dict[str, dict[str, int]]:
    """Runs, acks, retries and dead letters per task over the last ``TASK_WINDOW_S``,
    summed from every worker's chart samples (one XRANGE)."""
    since = now_ms - TASK_WINDOW_S * 1000
    rows, _ = task_growth(await scheduler.workers.samples(since_ms=since), since)
    return {
        task: dict(zip(("runs", "acked", "retries", "dead"), row[:4], strict=False))
        for task, row in rows.items()
    }


# inspect --job: the most occurrences it lists.
MAX_UPCOMING = 100


def _inspect_job(args: argparse.Namespace) -> int:
    """``inspect --job ID``: one job's state; for a recurring one its zone and its next
    occurrences, each in UTC and in local time."""

    async def body(scheduler: Scheduler) -> int:
        info = await scheduler.get(args.job)
        if info is None:
            emit(args, {"id": args.job, "found": False}, f"no job {args.job!r}")
            return EXIT_FAILED
        rec = info.recurrence
        upcoming = [
            {"ms": ms, "utc": iso(ms), "local": rec.local(ms).isoformat(timespec="seconds")}
            for ms in info.upcoming(min(args.upcoming, MAX_UPCOMING))
            if rec is not None
        ]
        data: dict[str, Any] = {
            "id": info.id,
            "found": True,
            "shard": info.shard,
            "state": info.state.name.lower(),
            "task": info.task,
            "when_ms": info.when_ms,
            "nominal_ms": info.nominal_ms,
            "attempt": info.attempt,
            "max_attempts": info.max_attempts,
            "priority": info.priority,
            "every_ms": rec.every_ms if rec is not None else 0,
            "cron": rec.cron if rec is not None else "",
            "tz": (rec.tz or "UTC") if rec is not None and rec.cron else "",
            "missed": rec.missed.value if rec is not None else "",
            "jitter_ms": rec.jitter_ms if rec is not None else 0,
            "upcoming": upcoming,
            "last_error": info.last_error,
            "key": info.key,
        }

        def text() -> str:
            lines = [
                f"job {info.id!r} (shard {info.shard}): {data['state']}, task {info.task!r},"
                f" at {iso(info.when_ms)}, attempt {info.attempt} of {info.max_attempts}"
                + (f", priority {info.priority}" if info.priority else "")
            ]
            if data["cron"]:
                lines.append(f"  cron {data['cron']!r} in {data['tz']}, missed: {data['missed']}")
            elif data["every_ms"]:
                lines.append(f"  every {data['every_ms'] / 1000:g}s")
            lines += [f"  next {o['local']}  (UTC {o['utc']})" for o in upcoming]
            if info.key is not None:
                lines.append(f"  key {info.key!r}")
            if info.last_error:
                lines.append(f"  last error: {info.last_error}")
            return "\n".join(lines)

        emit(args, data, text)
        return EXIT_OK

    def absent() -> int:
        return not_created(args, {"id": args.job, "found": False}, f"no job {args.job!r}: ")

    return run(args, lambda: with_scheduler(args, body, absent=absent))


def _inspect_text(namespace: str, rows: list[ShardInfo], totals: dict[str, int]) -> str:
    lines = [
        f"namespace {namespace!r}, {len(rows)} shards (Redis time {iso(rows[0].now_ms)})",
        f"  {'shard':>5} {'due':>8} {'overdue':>8} {'lag':>9} {'leased':>7} {'expired':>7} "
        f"{'dead':>6} {'epoch':>6}  {'owner':<12} next due",
    ]
    for r in rows:
        owner = f"{r.owner[:12]}" if r.owner else "-"
        lag = f"{r.lag_ms / 1000:.1f}s" if r.overdue else "-"
        nxt = iso(r.next_due_ms) if r.next_due_ms else "-"
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
    payload = job.payload
    undecodable = isinstance(payload, UndecodablePayload)
    if undecodable:  # its bytes as text, and why they did not decode
        payload = payload.data
    row = {
        "id": job.id,
        "shard": job.shard,
        "task": job.task,
        "payload": payload.decode(errors="replace") if isinstance(payload, bytes) else payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "died_ms": job.when_ms,
        "error": job.last_error,
    }
    if undecodable:
        row["payload_error"] = str(job.payload)
    return row


def _dead_letters(args: argparse.Namespace) -> int:
    action = f"dead-letters {args.action}"
    if args.action == "list" and (args.ids or args.all):
        bad = "job ids" if args.ids else "--all"
        return fail(args, CliError(EXIT_USAGE, f"{action} takes no {bad} (only --shard, --limit)"))
    if args.action != "list":
        if not args.ids and not args.all:
            return fail(args, CliError(EXIT_USAGE, f"{action}: give job ids, or --all"))
        if args.ids and args.all:
            return fail(args, CliError(EXIT_USAGE, f"{action}: give job ids or --all, not both"))
        if args.ids and args.shard is not None:
            return fail(
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
                    f"  {terminal(r['id'])}  shard {r['shard']}  task {terminal(r['task'])}  "
                    f"attempt {r['attempt']}/{r['max_attempts']}  died {iso(r['died_ms'])}  "
                    f"{terminal(r['error'])}"
                    for r in rows
                ]
                return "\n".join([f"{total} dead letters", *lines])

            emit(args, {"created": True, "total": total, "jobs": rows}, text)
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
        emit(args, {verb: done, "missing": missing}, said)
        return EXIT_FAILED if missing else EXIT_OK

    def absent() -> int:
        if args.action == "list":
            return not_created(args, {"total": 0, "jobs": []}, "0 dead letters: ")
        verb = "requeued" if args.action == "requeue" else "purged"
        return not_created(args, {verb: [], "missing": list(args.ids)}, f"{verb} nothing: ")

    return run(args, lambda: with_scheduler(args, body, absent=absent))


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add this group's commands (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    sched = add("schedule", "schedule a durable job", parents=[common])
    sched.add_argument("id", help="the job id (scheduling it again keeps the first)")
    sched.add_argument("task", help="the task name")
    sched.add_argument("payload", nargs="?", help="the payload, as JSON")
    when = sched.add_mutually_exclusive_group()
    when.add_argument("--delay", type=non_negative_float, help="seconds from Redis's now")
    when.add_argument("--at", help="epoch ms, or ISO 8601 with a zone")
    rec = sched.add_mutually_exclusive_group()
    rec.add_argument("--every", type=positive_float, help="recur every this many seconds")
    rec.add_argument("--cron", help="recur on a cron expression (UTC unless --tz)")
    sched.add_argument(
        "--tz", help="the IANA time zone --cron reads in, e.g. Europe/Paris (default UTC)"
    )
    sched.add_argument(
        "--jitter",
        type=non_negative_float,
        help="recurring only: run each occurrence up to this many seconds after it",
    )
    sched.add_argument(
        "--missed",
        choices=[m.value for m in MissedRun],
        default=MissedRun.ONCE.value,
        help="missed-run policy of a recurring job",
    )
    sched.add_argument("--replace", action="store_true", help="overwrite a due or dead job")
    sched.add_argument("--max-attempts", type=positive_int, default=DEFAULT_MAX_ATTEMPTS)
    sched.add_argument(
        "--timeout",
        type=positive_float,
        help="seconds its handler may run (before the task's and the worker's timeout)",
    )
    sched.add_argument("--key", help="the flow key the task's concurrency and rate limits count by")
    sched.add_argument(
        "--priority",
        type=int,
        choices=range(MAX_PRIORITY + 1),
        default=0,
        metavar=f"0..{MAX_PRIORITY}",
        help="among due jobs, a higher priority is claimed first (default 0, the lowest)",
    )
    for flag, what in (
        ("--debounce", "seconds: each schedule of this id while it waits moves it to now + this"),
        ("--max-wait", "with --debounce: due at most this long after the first schedule"),
        ("--throttle", "seconds: at most one run of this id per period; calls coalesce"),
    ):
        sched.add_argument(flag, type=positive_float, help=what)
    sched.set_defaults(func=_schedule)

    cancel = add("cancel", "remove a job in any state", parents=[common])
    cancel.add_argument("id", help="the job id")
    cancel.set_defaults(func=_cancel)

    insp = add("inspect", "per shard: due, overdue and lag, leased, dead, owner", parents=[common])
    insp.add_argument("--job", help="one job instead: its state, zone, next occurrences")
    insp.add_argument("--key", help="one flow key of --task instead: its permits and waiters")
    insp.add_argument("--task", help="--key: the task whose limits the key counts by")
    insp.add_argument(
        "--upcoming",
        type=positive_int,
        default=5,
        help=f"--job: occurrences to show (at most {MAX_UPCOMING})",
    )
    insp.set_defaults(func=_inspect)

    dead = add("dead-letters", "list, requeue or purge dead letters", parents=[common])
    dead.add_argument("action", choices=["list", "requeue", "purge"])
    dead.add_argument("ids", nargs="*", help="job ids (requeue, purge)")
    dead.add_argument("--all", action="store_true", help="requeue or purge every dead letter")
    dead.add_argument("--shard", type=non_negative_int, help="only this shard")
    dead.add_argument(
        "--limit",
        type=batch_size,
        default=100,
        help=f"list: at most this many per shard (1..{MAX_BATCH})",
    )
    dead.set_defaults(func=_dead_letters)
