"""The typed values of tickwheel.durable: job specs, claimed jobs, states, results.

Ground rules:

- Times are integers in ms since the epoch, read from Redis (names end in ``_ms``);
  durations given by users are seconds (float) or ``timedelta``, as in asyncio.
- A job is in exactly one :class:`JobState`; a completed or cancelled job has none.
- Validation happens when a :class:`JobSpec` is built, before anything is sent, so a bad
  argument writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any

from ._args import MAX_TIME_MS, finite_seconds_ms, int_between
from ._flow import NO_FLOW, flow_args
from ._priority import MAX_PRIORITY, PRIORITY_AGING, aging_ms, check_aging, check_priority
from ._recurrence import Recurrence

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "ERROR_TRACEBACK_MARK",
    "MAX_JOB_ID_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PRIORITY",
    "MAX_TASK_BYTES",
    "MAX_TRACE_BYTES",
    "MIN_AT_MS",
    "PRIORITY_AGING",
    "ClaimBatch",
    "DeadPage",
    "Job",
    "JobInfo",
    "JobSpec",
    "JobState",
    "ReapResult",
    "ScheduleResult",
    "ScheduleStatus",
    "ShardInfo",
    "aging_ms",
    "check_aging",
    "check_key",
    "check_priority",
    "check_trace",
    "split_error",
]

# Enough to ride out a short outage of a downstream service with exponential backoff
# (1 s, 2 s, 4 s, 8 s) without keeping a broken job alive for hours.
# Job ids are stored in two sorted sets and the done set: a cap keeps a runaway id (say a
# whole URL with its query string) from multiplying the memory of every entry.
MAX_JOB_ID_BYTES = 256
DEFAULT_MAX_ATTEMPTS = 5
# Task names are registry keys, stored in every record: short by nature.
MAX_TASK_BYTES = 128
# Longest W3C trace context a job record carries (traceparent, then a newline and the
# tracestate): 55 bytes of traceparent and a bounded tracestate (docs/tracing.md).
MAX_TRACE_BYTES = 512
# Longest flow key (schedule(key=)) in UTF-8 bytes: it is stored in the record and in
# the names of its permit keys (docs/limits.md), so it is kept short.
MAX_KEY_BYTES = 200
# The largest attempt count a record may hold (a msgpack uint32, far beyond any policy).
MAX_ATTEMPTS_LIMIT = 2**31 - 1


# A job's last error text is its summary (the exception's repr, or what retry() was
# given), then, when the worker kept one, this line and the traceback (its tail). A record
# written before tracebacks were kept, or a retry() given plain text, has no mark.
ERROR_TRACEBACK_MARK = "\nTraceback (most recent call last):\n"


def split_error(text: str) -> tuple[str, str]:
    """A job's ``last_error`` as ``(summary, traceback)``; the traceback is ``""`` when
    none was kept (an older record, or a retry given plain text)."""
    summary, mark, rest = text.partition(ERROR_TRACEBACK_MARK)
    if not mark:
        return text, ""
    return summary, mark.lstrip("\n") + rest


class JobState(IntEnum):
    """The state a job is in (codes as the scripts return them)."""

    DUE = 1  # in {ns:s}:due, waiting for its due time
    LEASED = 2  # in {ns:s}:leased, held by a claimer until the lease deadline
    DEAD = 3  # in {ns:s}:dead, after max attempts
    # In {ns:s}:due, waiting for a permit or a start of its flow key (docs/limits.md):
    # due at its recheck time (or its booked start), due now when a permit frees.
    WAITING = 4


class ScheduleStatus(IntEnum):
    """What scheduling a job id did (codes as schedule.lua returns them)."""

    CREATED = 1  # a new job
    KEPT = 2  # the id existed and replace was False: untouched
    REPLACED = 3  # the id was due or dead and replace was True: overwritten, now due
    BUSY = 4  # the id is leased (running): never replaced
    DONE = 5  # this occurrence (id, nominal due) completed already: nothing written
    COALESCED = 6  # debounce/throttle: folded into the id's waiting run (payload replaced)


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """The outcome of scheduling one job."""

    id: str  # the job id
    status: ScheduleStatus  # what happened
    when_ms: int  # due time (created/replaced/done), or the existing job's score


def check_task_name(name: object, parameter: str = "name") -> str:
    """Return ``name`` if it is a valid task name (the check of a job's ``task`` and of a
    registry's names).

    Raises:
        TypeError: if it is not a str.
        ValueError: if it is empty, longer than ``MAX_TASK_BYTES`` UTF-8 bytes, or holds
            a NUL or a lone surrogate.
    """
    if not isinstance(name, str):
        raise TypeError(f"{parameter} must be a str, got {type(name).__name__}")
    if not 0 < len(_utf8(name, parameter)) <= MAX_TASK_BYTES:
        raise ValueError(f"{parameter} must be 1 to {MAX_TASK_BYTES} UTF-8 bytes, got {name!r}")
    return name


def _utf8(text: str, parameter: str) -> bytes:
    """``text`` as UTF-8, if it holds no NUL (PostgreSQL's text cannot hold one: both
    modes refuse it alike) and no lone surrogate (no UTF-8 for it).

    Raises:
        ValueError: naming ``parameter``.
    """
    if "\x00" in text:
        raise ValueError(f"{parameter} must not contain NUL (\\x00), got {text!r}")
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise ValueError(
            f"{parameter} must be valid Unicode (no lone surrogates), got {text!r}"
        ) from None


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it is a valid job id.

    Raises:
        TypeError: if it is not a str.
        ValueError: if it is empty, longer than ``MAX_JOB_ID_BYTES`` UTF-8 bytes, or
            holds a NUL or a lone surrogate.
    """
    if not isinstance(job_id, str):
        raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
    size = len(_utf8(job_id, "job_id"))
    if size == 0:
        raise ValueError("job_id must not be empty")
    if size > MAX_JOB_ID_BYTES:
        raise ValueError(f"job_id must be at most {MAX_JOB_ID_BYTES} UTF-8 bytes, got {size}")
    return job_id


# The earliest ``at`` accepted: 2000-01-01T00:00:00Z in epoch ms. An earlier time is a
# mistake, most often epoch *seconds* where ms are expected (int(time.time()) reads as
# January 1970 in ms, and ran at once): any time in seconds up to the year 31,000 is
# below it. A job meant to run at once takes no ``at`` (or ``delay=0``).
MIN_AT_MS = 946_684_800_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def when_args(delay: float | timedelta | None, at: int | datetime | None) -> tuple[int, int]:
    """Return ``(mode, time)`` for a script: mode 1 a delay in ms, mode 0 an epoch ms.

    ``at`` is epoch ms (int) or an aware datetime, on or after 2000-01-01 (``MIN_AT_MS``):
    an earlier one, such as epoch seconds given as ms, is refused.

    Raises:
        TypeError, ValueError: naming ``delay`` or ``at``.
    """
    if delay is not None and at is not None:
        raise ValueError("give delay or at, not both")
    if at is None:
        ms = finite_seconds_ms("delay", 0 if delay is None else delay)
        if ms > MAX_TIME_MS:
            raise ValueError(f"delay must be at most {MAX_TIME_MS} ms, got {ms} ms")
        return 1, ms
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise ValueError(f"at must be timezone-aware, got naive {at!r}")
        try:
            ms = (at.astimezone(UTC) - _EPOCH) // timedelta(milliseconds=1)
        except OverflowError:  # e.g. 9999-12-31T23:59-14:00 is in year 10000 in UTC
            raise ValueError(f"at must be before year 10000 in UTC, got {at.isoformat()}") from None
        if ms < MIN_AT_MS:
            raise ValueError(f"at must be on or after 2000-01-01T00:00:00Z, got {at.isoformat()}")
        return 0, ms
    if isinstance(at, int) and not isinstance(at, bool):
        if not 0 <= at <= MAX_TIME_MS:
            raise ValueError(f"at must be epoch ms between 0 and {MAX_TIME_MS}, got {at}")
        if at < MIN_AT_MS:
            raise ValueError(
                f"at must be epoch milliseconds on or after 2000-01-01 ({MIN_AT_MS}), got {at}"
                " (epoch seconds? multiply by 1000)"
            )
        return 0, at
    raise TypeError(f"at must be epoch ms (int) or a datetime, got {at!r}")


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to schedule. Validated on construction: a bad field raises at once.

    Args:
        id: the job id (stable; re-scheduling the same id is idempotent).
        task: the task name the handler is registered under.
        payload: bytes, or a JSON value that comes back equal (``_payload.py``),
            checked when it is encoded.
        delay: seconds (or timedelta) from Redis's now; the default is now.
        at: absolute due, epoch ms or an aware datetime (excludes ``delay``). Both are
            at most ``MAX_TIME_MS`` (2**53 - 1 ms, the scripts' exact doubles).
        max_attempts: attempts before the job goes dead.
        recurrence: for a recurring job; the first run is ``delay``/``at`` if given,
            else the first occurrence after now.
        timeout: seconds this job's handler may run (whole ms, rounded up), before its
            task's timeout and the worker's default; None (the default): theirs. Stored
            with the job (a recurring series' runs keep it).
        trace: the W3C trace context the job carries to its runs (``traceparent``,
            then a newline and the ``tracestate`` if any; ASCII, at most
            ``MAX_TRACE_BYTES``). A scheduler made with ``tracing=True`` sets it to its
            schedule span's; "" (the default): none.
        debounce: seconds: each schedule of the id while its job waits moves its due
            to now + ``debounce`` (docs/durable.md, "Debounce and throttle").
        max_wait: with ``debounce``: the job is due at most this long after the first
            schedule of the burst.
        throttle: seconds: at most one run of the id per period; schedules while its
            job waits coalesce into that run.
        key: the flow key (``"merchant:42"``): the task's ``concurrency`` and ``rate``
            limits count runs per key (docs/limits.md). Non-empty text without NUL, at
            most ``MAX_KEY_BYTES`` UTF-8 bytes; None (the default): the task's single key.
        priority: 0 (the default and lowest) to ``MAX_PRIORITY`` (9): among the jobs
            that are due, a higher priority is claimed first; never before its due.
            A job late by more than the claim's aging (``PRIORITY_AGING``, 60 s) is
            claimed before any priority, oldest first (docs/flow-control.md).

    Raises:
        TypeError, ValueError: naming the bad parameter.
    """

    id: str
    task: str
    payload: Any = b""
    delay: float | timedelta | None = None
    at: int | datetime | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    recurrence: Recurrence | None = None
    timeout: float | timedelta | None = None
    trace: str = field(default="", repr=False, compare=False)
    debounce: float | timedelta | None = None
    max_wait: float | timedelta | None = None
    throttle: float | timedelta | None = None
    key: str | None = None
    priority: int = 0
    mode: int = field(init=False, repr=False, compare=False)  # 1 delay, 0 absolute
    time_ms: int = field(init=False, repr=False, compare=False)  # delay or epoch ms
    timeout_ms: int = field(init=False, repr=False, compare=False)  # 0: none
    # debounce/throttle (flow.lua): kind "" none, "d" or "t"; its window and max_wait (ms)
    flow: tuple[str, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The common spec passes on the fast path: an ASCII str id and task without NUL,
        # short enough that no UTF-8 encoding of them is over the limit (4 bytes a
        # character at most), the default attempts, a delay of whole seconds; anything
        # else gets the full checks and their errors. (timeit: 1.24 against 1.48 us a
        # spec; isascii() is O(1), and rules out lone surrogates.)
        ident, task = self.id, self.task
        if not (
            type(ident) is str
            and 0 < len(ident) <= MAX_JOB_ID_BYTES // 4
            and ident.isascii()
            and "\x00" not in ident
            and type(task) is str
            and 0 < len(task) <= MAX_TASK_BYTES // 4
            and task.isascii()
            and "\x00" not in task
        ):
            check_job_id(ident)
            check_task_name(task, "task")
        if self.max_attempts != DEFAULT_MAX_ATTEMPTS or type(self.max_attempts) is not int:
            int_between("max_attempts", self.max_attempts, 1, MAX_ATTEMPTS_LIMIT)
        if self.recurrence is not None and not isinstance(self.recurrence, Recurrence):
            raise TypeError(f"recurrence must be a Recurrence, got {self.recurrence!r}")
        if self.trace:
            check_trace(self.trace)
        if self.key is not None:
            check_key(self.key)
        delay: object = self.delay  # an int of seconds is a float to the type checker
        if self.at is None and type(delay) is int and 0 <= delay <= MAX_TIME_MS // 1000:
            mode, time_ms = 1, delay * 1000
        else:
            mode, time_ms = when_args(self.delay, self.at)
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "time_ms", time_ms)
        timeout_ms = 0
        if self.timeout is not None:
            timeout_ms = finite_seconds_ms("timeout", self.timeout, minimum_ms=1)
            int_between("timeout", timeout_ms, 1, MAX_TIME_MS)
        object.__setattr__(self, "timeout_ms", timeout_ms)
        flow = NO_FLOW
        if self.debounce is not None or self.max_wait is not None or self.throttle is not None:
            flow = flow_args(self)
        object.__setattr__(self, "flow", flow)
        priority = self.priority
        if type(priority) is not int or priority:
            check_priority(priority)


def check_key(key: object) -> str:
    """A flow key checked: non-empty text without NUL, at most :data:`MAX_KEY_BYTES`
    UTF-8 bytes.

    Raises:
        TypeError: naming ``key``, if it is not a str.
        ValueError: naming ``key``, if it is empty, too long or holds a NUL.
    """
    if type(key) is not str:
        raise TypeError(f"key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("key must not be empty (None: the task's single key)")
    if "\x00" in key:
        raise ValueError("key must not contain NUL")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ValueError("key must be valid text (no lone surrogates)") from None
    if size > MAX_KEY_BYTES:
        raise ValueError(f"key must be at most {MAX_KEY_BYTES} UTF-8 bytes, got {size}")
    return key


def check_trace(trace: object) -> str:
    """A job's trace context checked: ASCII text without NUL, at most
    :data:`MAX_TRACE_BYTES`.

    Raises:
        TypeError, ValueError: naming ``trace``.
    """
    if type(trace) is not str:
        raise TypeError(f"trace must be a str, got {type(trace).__name__}")
    if len(trace) > MAX_TRACE_BYTES or not trace.isascii() or "\x00" in trace:
        raise ValueError(f"trace must be ASCII without NUL, at most {MAX_TRACE_BYTES} bytes")
    return trace


@dataclass(slots=True)
class Job:
    """A claimed job: the handler's view. ``(id, nominal_ms)`` is the idempotency key.

    Treat it as read-only. It is not frozen because a claim builds one per job and a
    frozen dataclass's ``__init__`` costs twice as much (bench: durable claim+ack).
    Built by keyword (``store/_codec.py`` decodes a claim's rows into it).
    """

    id: str  # job id
    shard: int  # its shard
    task: str  # task name
    payload: Any  # bytes, the decoded JSON value, or an UndecodablePayload
    nominal_ms: int  # nominal due: the occurrence's identity (dedup key with id)
    due_ms: int  # the due score it was claimed at (later than nominal after a retry)
    deadline_ms: int  # lease deadline
    attempt: int  # attempt number, from 1
    max_attempts: int  # attempts before it goes dead
    epoch: int  # the owner epoch the lease was taken under
    recurrence: Recurrence | None  # set for recurring jobs
    next_due_ms: int = 0  # the next occurrence ack re-inserts (recurring); 0 none
    duplicate: bool = False  # this occurrence was done already: ack it without running
    last_error: str = ""  # error of the previous attempt
    # Index of its record hash in the shard, as the claim found it (the ack sends it
    # back, so Redis does not hash the id again); -1 when not known.
    bucket: int = -1
    timeout_ms: int = 0  # this job's own timeout (schedule(timeout=)); 0: none
    # The W3C trace context its producer stored (JobSpec.trace, as bytes; b"" none).
    # Bounded by the claim, never trusted: tracing parses it, and a bad one is ignored.
    trace: bytes = b""
    key: str = ""  # its flow key (schedule(key=)); "": none (the task's single key)
    version: int = 0  # the Postgres mode's row version its entry carries; 0: none


@dataclass(frozen=True, slots=True)
class JobInfo:
    """One job's state, as :meth:`Scheduler.get` and the dead-letter list return it."""

    id: str  # job id
    shard: int  # its shard
    state: JobState  # due, leased or dead
    when_ms: int  # due time, lease deadline or time of death, by state
    task: str  # task name
    payload: Any  # bytes, the decoded JSON value, or an UndecodablePayload
    nominal_ms: int  # nominal due
    attempt: int  # attempt number, from 1
    max_attempts: int  # attempts before it goes dead
    epoch: int  # epoch of the current lease; 0 when not leased
    recurrence: Recurrence | None  # set for recurring jobs
    last_error: str  # error of the last failed attempt
    timeout_ms: int = 0  # its own timeout (schedule(timeout=)); 0: none
    key: str | None = None  # its flow key (schedule(key=)); None: none
    priority: int = 0  # schedule(priority=): among due jobs, higher is claimed first

    def upcoming(self, count: int = 5) -> list[int]:
        """A recurring job's next ``count`` occurrences (UTC instants, ms), from the one
        it runs next: its current one while due, the one after while leased; ``[]``
        for a one-shot or a dead job. ``recurrence.local(ms)`` reads one in the
        series' zone."""
        rec = self.recurrence
        if rec is None or self.state is JobState.DEAD:
            return []
        first = self.nominal_ms
        if self.state is JobState.LEASED:
            first = rec.next_after(self.nominal_ms, self.nominal_ms)
        return rec.upcoming(first, count)


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    """What one claim returned."""

    shard: int  # the shard claimed from
    # Redis's now at the claim, plus the whole ms the client spent after the script's
    # reply (a Postgres check, a missed-run move): convert due times to a local clock
    # from the moment the claim returned
    now_ms: int
    jobs: list[Job]  # leased jobs, in claim order: due order, higher priorities first
    dropped: int  # one-shot jobs dropped because their occurrence was done
    moved: int = 0  # recurring jobs moved unrun by their missed-run policy
    parked: int = 0  # due jobs of paused tasks set aside until a resume (not leased)
    waited: int = 0  # jobs over their flow key's limit, left waiting (not leased)
    held: Sequence[Job] = ()  # the jobs among ``jobs`` whose permit the claim took


@dataclass(frozen=True, slots=True)
class ReapResult:
    """What one reap returned."""

    shard: int  # the shard reaped
    now_ms: int  # Redis's now at the reap
    requeued: list[str]  # ids returned to due (attempt + 1)
    dead: list[str]  # ids moved to dead (max attempts reached)


@dataclass(frozen=True, slots=True)
class DeadPage:
    """A page of dead letters."""

    total: int  # dead letters in the shard
    jobs: list[JobInfo]  # this page, oldest first


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard as an operator sees it (inspect.lua), at Redis's ``now_ms``."""

    shard: int  # the shard
    now_ms: int  # Redis's now for the shard
    due: int  # jobs waiting for their due time (or overdue)
    overdue: int  # due jobs whose time has come and that nobody claimed yet
    oldest_overdue_ms: int  # due time of the oldest overdue job; 0 when none
    next_due_ms: int  # the earliest due time after now; 0 when none
    leased: int  # jobs claimed and not yet acked
    expired: int  # leases past their deadline, waiting for the reaper
    dead: int  # dead letters
    owner: str  # the owner's token; "" when no one owns the shard
    owner_ttl_ms: int  # how long the owner's token lives without renewal; -2 when free
    epoch: int  # the shard's fencing epoch
    # due jobs of paused tasks a claim set aside (counted in due, not in overdue)
    parked: int = 0
    paused: tuple[str, ...] = ()  # the shard's copy of the paused tasks ("" = all)
    # jobs waiting for a permit of their flow key: in no index (not in due), woken into
    # due when a permit frees (docs/limits.md)
    waiting: int = 0

    @property
    def lag_ms(self) -> int:
        """How late the oldest overdue job is (ms); 0 when none is overdue."""
        return self.now_ms - self.oldest_overdue_ms if self.overdue else 0

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, with ``lag_ms``."""
        return {**asdict(self), "lag_ms": self.lag_ms}
