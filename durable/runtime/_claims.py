"""Claiming and placing: the claim rounds over the owned shards, the conversion of each
claimed job's due time on Redis's clock to loop time, and its timer on the wheel, which
hands it to the :class:`Runner` when it fires.

Ground rules:

- Only shards this process owns are claimed, with their epoch.
- Never early: a job is placed at ``t_reply + (due_ms - now_ms) / 1000`` in loop time,
  where ``now_ms`` is Redis's now inside the claim script (plus the whole ms the claim
  spent after its reply, in the Postgres mode) and ``t_reply`` is ``loop.time()`` once
  the claim returned. The reply comes after the script ran, so the placement can only
  be late (by the round trip), never early.
- A claimed job holds a lease of ``lookahead + lease``: it covers the wait in the wheel
  and one lease of run time. Its end is placed from ``loop.time()`` *before* the claim
  was sent, so the check of it when the job starts errs towards not running.
- Backpressure: no claim while ``max_loaded`` jobs are in memory, or while as many
  fired jobs wait for a slot as there are slots (the rest stays due in Redis for other
  workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable
from contextlib import AbstractContextManager

from tickwheel.durable.model import (
    PRIORITY_AGING,
    Fenced,
    Job,
    LatenessHistogram,
    NotOwner,
)
from tickwheel.durable.scheduler import Scheduler
from tickwheel.wheel import Timer, TimingWheel

from ._loader_stats import LoaderStats
from ._logs import OUTAGE_ERRORS, Outages, job_fields
from ._runner import Runner

__all__ = [
    "DEFAULT_LIMIT",
    "DEFAULT_LOOKAHEAD",
    "DEFAULT_MAX_LOADED",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_START_MARGIN",
    "UNAVAILABLE_BACKOFF",
    "Claimer",
]

logger = logging.getLogger("tickwheel.durable")

# How far ahead jobs are claimed (s). Long enough to hide a claim round trip and a poll
# interval, short enough that a crash strands few jobs until their lease expires.
DEFAULT_LOOKAHEAD = 1.0
# The pre-start lease past the lookahead (s): a claimed job's lease until its run starts
# (then it is extended to the whole lease). It bounds how long the jobs a dead worker
# had claimed but not started wait for the reaper, and the start of a job that waits for
# a slot (shed at half of it). Seconds, not less: a worker whose loop stalls longer has
# its unstarted jobs returned by its reaper (at no attempt) and claimed again.
DEFAULT_START_MARGIN = 5.0
# Pause between claim rounds (s) when no shard had a full batch: jobs are claimed
# `lookahead` early, so a poll of a tenth of it never makes one late.
DEFAULT_POLL_INTERVAL = 0.1
# Claimed per shard per call: the source document's LIMIT 500 per 100 ms poll
# (docs/design.md).
DEFAULT_LIMIT = 500
# Jobs loaded or running before the loader stops claiming: bounds memory when the
# handlers fall behind (the rest stays due in Redis for other workers).
DEFAULT_MAX_LOADED = 50_000
# Wait after Redis was unreachable (s): long enough not to spin, short next to a lease.
UNAVAILABLE_BACKOFF = 0.5


class Claimer:
    """Claim due jobs of the owned shards into the wheel; fire each into ``runner``.

    Args:
        scheduler: claims, and the ownership that says which shards to claim.
        wheel: where claimed jobs wait for their due time (on the running loop).
        stats: where claims and round failures are counted.
        runner: what fired jobs are handed to; its queue is the backpressure.
        lookahead_ms: claim jobs due within this many ms.
        lease_ms: run time a lease covers (the claim leases ``lookahead_ms`` more).
        start_ms: the pre-start margin: claims take pre-start leases of
            ``lookahead_ms + start_ms`` (extended to ``lease_ms`` when a run starts);
            None: claims lease ``lookahead_ms + lease_ms`` outright.
        held: with ``start_ms``, is this job's very lease still run or acked here (a
            claim returned it again: its pre-start lease ran out first)? Not placed.
        claiming: with ``held``, entered around each claim call and the placing of its
            reply (:meth:`AckBatcher.claiming`): an ack whose reply comes meanwhile is
            one ``held`` still knows.
        limit: jobs per shard per claim.
        poll_ms: ms between claim rounds.
        max_loaded: claim nothing while this many jobs are in memory.
        outages: where store outages are reported (logged once each).
        priority_aging: seconds late after which a job goes before any priority
            (None: never); see ``Leases.claim``.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        wheel: TimingWheel,
        stats: LoaderStats,
        runner: Runner,
        *,
        lookahead_ms: int,
        lease_ms: int,
        limit: int,
        poll_ms: int,
        max_loaded: int,
        outages: Outages | None = None,
        start_ms: int | None = None,
        held: Callable[[Job], bool] | None = None,
        claiming: Callable[[], AbstractContextManager[None]] | None = None,
        priority_aging: float | None = PRIORITY_AGING,
    ) -> None:
        self.scheduler = scheduler
        self.leases = scheduler.leases  # claim, without the facade's extra call
        self.wheel = wheel
        self.stats = stats
        self._runner = runner
        self.lookahead_ms = lookahead_ms
        self.lease_ms = lease_ms
        self.start_ms = start_ms  # pre-start margin, or None
        self._held = held  # is a job's lease run or acked here already?
        self._claiming = claiming if claiming is not None else contextlib.nullcontext
        self.limit = limit
        self.poll_ms = poll_ms
        self.max_loaded = max_loaded
        self.priority_aging = priority_aging  # s, or None (Leases.claim)
        self.outages = outages if outages is not None else Outages()
        self.tracer = scheduler.tracer  # a span per claim that leased jobs (None: off)
        # Firing lateness (s): loop time at firing minus the job's due in loop time.
        self.lateness = LatenessHistogram()
        # (shard, job id) -> (job, its wheel timer, loop time its lease runs out, loop
        # time it is due: Redis's due converted with the claim's offset)
        self._placed: dict[tuple[int, str], tuple[Job, Timer, float, float]] = {}
        self.claiming = True  # False once stop() was called
        # Held while a shard is claimed and placed: giving a shard back takes it, so no
        # claim reply lands after the shard's jobs were released.
        self.lock = asyncio.Lock()
        self._stopped = asyncio.Event()  # set by stop() and poke(): wakes run()
        self._woken: set[int] = set()  # shards to claim now (claim_now), not claimed yet
        self._woken_tokens: dict[int, str] = {}  # shard -> the last woken claim's token
        self._claiming_woken: asyncio.Task[None] | None = None  # claims them

    @property
    def placed(self) -> int:
        """Jobs in the wheel, not fired yet."""
        return len(self._placed)

    def placed_shards(self) -> set[int]:
        """The shards that have a job in the wheel."""
        return {shard for shard, _ in self._placed}

    # -- claim rounds --------------------------------------------------------------

    async def load_once(self) -> bool:
        """One claim round over the owned shards; True if some shard returned a full
        batch (see :meth:`Loader.load_once`)."""
        return await self._claim_shards(list(self.scheduler.ownership.owned))

    async def _claim_shards(self, shards: list[int]) -> bool:
        """Claim ``shards`` (those still owned) in turn, while memory and the slots'
        queue have room; True if some shard returned a full batch."""
        full = False
        prestart = self.start_ms is not None
        lease_ms = self.lookahead_ms + (
            self.start_ms if self.start_ms is not None else self.lease_ms
        )
        runner = self._runner
        owned = self.scheduler.ownership.owned
        for shard in shards:
            in_memory = len(self._placed) + runner.waiting + runner.running
            if not self.claiming or in_memory >= self.max_loaded:
                break
            if runner.backlogged:  # a slot's worth waits per slot
                runner.room.clear()
                break
            async with self.lock:
                # Checked under the lock: a shutdown hands the loaded jobs back under it.
                if not self.claiming or shard not in owned:
                    continue
                with self._claiming():
                    full = await self._claim(shard, lease_ms, prestart) or full
        return full

    def claim_now(self, shards: set[int]) -> None:
        """Claim ``shards`` at once, not waiting for the next round: jobs were made due
        now there (waiters woken by a release here, on the permits it handed them).
        The claims of one call go in turn; the shards asked for meanwhile go next."""
        self._woken |= shards
        if self._claiming_woken is None:
            self._claiming_woken = asyncio.ensure_future(self._claim_woken())

    async def take_woken(
        self, woken: dict[int, list[tuple[str, str]]]
    ) -> dict[int, list[int] | None]:
        """Wake the waiters ``woken`` (shard -> ``(task, job id)``), which a release here
        handed permits to, and lease those now due to this worker in the same call
        (woken.lua, one a shard, all in flight at once), placed in the wheel as a
        claim's jobs are. Per shard woken.lua's codes, or None when this worker does
        not take them (not claiming, the shard not owned or fenced meanwhile, no room
        in memory): the caller wakes those plainly. A backlog of the slots does not
        stop them, as it stops claims: each came from a run that ended here and holds
        a permit, so they take the slots those runs left, not more.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        out: dict[int, list[int] | None] = dict.fromkeys(woken)
        runner = self._runner
        if len(self._placed) + runner.waiting + runner.running >= self.max_loaded:
            return out
        async with self.lock:
            owned = self.scheduler.ownership.owned
            if not self.claiming:
                return out
            shards = [s for s in woken if s in owned]
            with self._claiming():
                t_sent = asyncio.get_running_loop().time()
                got = await asyncio.gather(
                    *(self._take_woken(s, owned[s], woken[s], t_sent) for s in shards)
                )
            out.update(zip(shards, got, strict=True))
        return out

    async def _take_woken(
        self, shard: int, epoch: int, woken: list[tuple[str, str]], t_sent: float
    ) -> list[int] | None:
        lease_ms = self.lookahead_ms + (
            self.start_ms if self.start_ms is not None else self.lease_ms
        )
        token, forget = secrets.token_hex(8), self._woken_tokens.pop(shard, None)
        try:
            with self.scheduler.ownership.guard(shard, epoch):
                codes, batch = await self.scheduler.store.limits.claim_woken(
                    shard,
                    epoch,
                    woken,
                    lease_ms,
                    token=token,
                    forget=forget,
                    prestart=self.start_ms is not None,
                )
        except Fenced:  # counted, and the shard forgotten, by the loader's on_fenced
            return None
        self._woken_tokens[shard] = token
        loop = asyncio.get_running_loop()
        t_reply = loop.time()
        self.stats.claimed += len(batch.jobs)
        for job in batch.jobs:
            when = t_reply + (job.due_ms - batch.now_ms) / 1000
            self._place(job, when, t_sent + (job.deadline_ms - batch.now_ms) / 1000)
            if when <= t_reply:  # due: fired at the loop's next turn, not the wheel's tick
                loop.call_soon(self._fire_now, (job.shard, job.id))
        return codes

    def _fire_now(self, key: tuple[int, str]) -> None:
        entry = self._placed.get(key)
        if entry is not None:
            entry[1].cancel()
            self._fire(key)

    async def _claim_woken(self) -> None:
        try:
            while self._woken and self.claiming:
                shards, self._woken = sorted(self._woken), set()
                try:
                    if await self._claim_shards(shards):
                        self.poke()  # a full batch: more is due, the rounds go on
                except OUTAGE_ERRORS as exc:  # the jobs stay due: the rounds claim them
                    self.stats.unavailable += 1
                    self.outages.failed("loader", exc)
                    return
                except Exception:
                    self.stats.errors += 1
                    logger.exception("claim of woken jobs failed")
                    return
        finally:
            self._claiming_woken = None

    async def _claim(self, shard: int, lease_ms: int, prestart: bool) -> bool:
        """Claim ``shard``'s due jobs and place them; True if the batch was full. Under
        the lock, in a claim window of the acks (``claiming``)."""
        loop = asyncio.get_running_loop()
        started_ns = 0 if self.tracer is None else self.tracer.now_ns()
        t_sent = loop.time()
        limiter = self._runner.limiter
        limits = limiter.for_claim()  # the permits it takes (one Redis, Redis-only mode)
        try:
            batch = await self.leases.claim(
                shard,
                limit=self.limit,
                lookahead=self.lookahead_ms / 1000,
                lease=lease_ms / 1000,
                prestart=prestart,
                priority_aging=self.priority_aging,
                limits=limits,
            )
        except Fenced:  # counted, and the shard forgotten, by the loader's on_fenced
            return False
        except NotOwner:  # given back while we were claiming another shard
            return False
        t_reply = loop.time()
        self.stats.claimed += len(batch.jobs)
        if self.tracer is not None and batch.jobs:
            self.tracer.claimed(batch, started_ns)
        if batch.jobs and logger.isEnabledFor(logging.DEBUG):
            _log_claimed(batch.jobs, batch.now_ms)
        for job in batch.jobs:
            self._place(
                job,
                t_reply + (job.due_ms - batch.now_ms) / 1000,
                t_sent + (job.deadline_ms - batch.now_ms) / 1000,
            )
        if batch.held and limits is not None:
            placed = self._placed
            for job in batch.held:  # not placed: its run here holds the permit already
                if (entry := placed.get((job.shard, job.id))) is not None and entry[0] is job:
                    limiter.took(job, limits)
        if batch.waited:
            self.stats.limit_waits += batch.waited
        got = len(batch.jobs) + batch.dropped + batch.moved + batch.parked + batch.waited
        return got >= self.limit

    def _place(self, job: Job, when: float, lease_end: float) -> None:
        if self._held is not None and self._held(job):
            # The run here (its start's extension, its ack) holds this lease too.
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "job %r claimed again while its run here holds the lease: not placed",
                    job.id,
                    extra=job_fields(job),
                )
            return
        key = (job.shard, job.id)
        old = self._placed.pop(key, None)
        if old is not None:  # a stale copy (its lease was lost): forget it
            old[1].cancel()
        timer = self.wheel.schedule_at(when, self._fire, key)
        self._placed[key] = (job, timer, lease_end, when)

    def _fire(self, key: tuple[int, str]) -> None:
        entry = self._placed.pop(key, None)
        if entry is None:
            return
        job, _, lease_end, when = entry
        late = self.wheel.time() - when
        self.lateness.observe(late)
        self.stats.tasks.fired(job.task, late)
        self._runner.fire(key, job, lease_end, when)

    async def run(self) -> None:
        """Claim rounds until :meth:`stop` (see :meth:`Loader.run`)."""
        with contextlib.suppress(*OUTAGE_ERRORS):
            await self._runner.limiter.start()  # else at its first limited job
        while self.claiming:
            try:
                if self.claiming:
                    self._stopped.clear()  # a poke from now on starts another round
                full = await self.load_once()
            except OUTAGE_ERRORS as exc:
                self.stats.unavailable += 1
                self.outages.failed("loader", exc)
                await self._pause(UNAVAILABLE_BACKOFF)
                continue
            except Exception:  # a bug or a server error: keep the other shards going
                self.stats.errors += 1
                logger.exception("claim round failed")
                await self._pause(UNAVAILABLE_BACKOFF)
                continue
            self.outages.ok("loader")
            self._runner.limiter.recheck_soon()  # the flow keys' lost wakes
            if self._runner.backlogged:
                # Backpressure: claim again as soon as the queue shortens.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._runner.room.wait(), self.poll_ms / 1000)
            elif not full:
                await self._pause(self.poll_ms / 1000)

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less if :meth:`stop` is called meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped.wait(), seconds)

    def poke(self) -> None:
        """Start the next claim round now (a job was made due now: a woken waiter)."""
        self._stopped.set()

    def stop(self) -> None:
        """Claim nothing more."""
        self.claiming = False
        self._stopped.set()

    # -- taking jobs out of the wheel ----------------------------------------------

    def drop_one(self, key: tuple[int, str]) -> bool:
        """Forget one placed job (its record was cancelled): its timer will not fire.
        True if it was placed. O(1)."""
        entry = self._placed.pop(key, None)
        if entry is None:
            return False
        entry[1].cancel()
        self._runner.limiter.unstarted(entry[0])  # a permit its claim took is freed
        return True

    def take_placed(self, shard: int) -> list[Job]:
        """Take the jobs of ``shard`` out of the wheel (in placing order), to be handed
        back."""
        entries = [self._placed.pop(k) for k in [k for k in self._placed if k[0] == shard]]
        for _, timer, _, _ in entries:
            timer.cancel()
        return [job for job, *_ in entries]

    def drop_placed(self, shard: int, epoch: int | None) -> int:
        """Forget the jobs of ``shard`` in the wheel (all, or those leased under
        ``epoch`` or before); how many."""
        keys = [
            key
            for key, (job, *_) in self._placed.items()
            if key[0] == shard and (epoch is None or job.epoch <= epoch)
        ]
        unstarted = self._runner.limiter.unstarted  # a permit its claim took is freed
        for key in keys:
            job, timer, *_ = self._placed.pop(key)
            timer.cancel()
            unstarted(job)
        return len(keys)


def _log_claimed(jobs: list[Job], now_ms: int) -> None:
    """The DEBUG line of each claimed job (due in how long, by Redis's clock)."""
    for job in jobs:
        logger.debug(
            "job %r claimed (task %s, attempt %d, due in %d ms)",
            job.id,
            job.task,
            job.attempt,
            job.due_ms - now_ms,
            extra=job_fields(job),
        )
