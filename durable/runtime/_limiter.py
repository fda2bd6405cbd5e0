"""A worker's side of the flow limits (issue 35; docs/limits.md): the permit a limited
task's job takes before its handler starts, the wait of a job over its key's limit, and
the release that hands freed permits to the waiters and wakes them.

Ground rules:

- The limits are those Redis holds (``{ns}:limits``): the worker writes its registry's
  declarations when it starts (the last writer wins) and reads them back every
  ``LIMITS_REFRESH`` s. A task without limits there costs a dict look-up per job.
- A limited job fires (the wheel's timer, as any job), then takes a permit in its key's
  slot (limits.lua) before the runner starts it. Over the limit, it goes back to its
  shard, unspent (waits.lua, as retry.lua mode 3): for a permit, queued in its key's
  waiters and in no index of its shard (its record says it waits), its key's recheck
  timer in the shard set; for the rate, due at the start booked for it. Nothing of it
  stays in this process.
- A run's end (its handler returned, was stopped or failed) releases its permit; the
  release hands the freed permits to the first waiters, and each one's wait ends (it
  was in no index) and it is claimed by its shard's owner at once. When that is this
  worker, one call a shard wakes them and leases them here (woken.lua, the Claimer's
  ``take_woken``), and they fire at the loop's next turn; without it (the Postgres
  mode, no room in memory), waits.lua wakes them and a claim of just their shards
  follows (``claim_now``). Another worker's shard: woken by waits.lua, claimed within
  that worker's poll interval.
- A permit handed to a waiter is the job's (held by ``""`` in its key's slot, with a
  deadline of one permit). This worker, having handed it and woken the job in a shard
  it owns, notes the grant; the job's next claim here starts on it with no second
  permit call, if it fires within half a permit of the release (``grant_s``) and its
  task has no rate (a start must be counted in the window). A grant found older asks
  again: limits.lua's acquire takes a handed permit that has not expired, or queues
  the job again. The run holds the grant as ``""``: its extensions and its release
  name ``""``, so a later claim of the same job (its lease lost) that takes the
  permit under its own holder is never freed by this one. (limits.lua cannot tell a
  grant run on from one not taken yet: one past its deadline puts its job back at the
  head of the waiters, whose wake then finds the job as it is.)
- Batches, as the acks: the gates of the jobs fired while one batch is in flight go
  together in the next (permits taken in limits.lua calls of many jobs, then the
  waits in waits.lua calls of many jobs per shard), and so do the releases and their
  wakes. One batch of each kind is in flight at a time; each is a pipeline (one round
  trip per node). Each job's permit is still decided atomically in its key's slot.
- A permit is held under the run's lease: its deadline is the lease's length, pushed
  with every lease extension. A worker killed while a run holds a permit leaks it for
  at most a lease. The recheck time (two leases) bounds the wait of a job whose wake
  was lost the same way (its waker killed between the release and the wake): after
  each claim round (at most once per ``RECHECK_PACE`` s) the owner of a shard
  rechecks the flow keys whose timer there is due (``_rechecks.py``):
  permits past their deadline freed, free ones handed to the first waiters, and every
  handed permit not taken yet woken (again).
- On one Redis in the Redis-only mode, the claim takes the permits itself
  (:meth:`for_claim`: the limits of record of the tasks with a concurrency and no
  rate, sent with each claim; claim.lua): a job it leases holding its permit is noted
  here (:meth:`took`) and starts with no permit call; one over the limit was left
  waiting by the claim, never leased. A job the claim leased with its permit that
  does not start here (handed back, shed, cancelled, its lease run out) frees it
  (:meth:`unstarted`). ``in_claim`` False keeps every job on the gate (as a worker of
  the previous release, whose claim takes no permit: both share the same keys).
- Nothing here raises into the runner: a failed call is counted and logged, and the job
  is left to its lease (the reaper returns it unspent: a pre-start lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from tickwheel.durable.model import Fenced, Job, Limits, PostgresUnavailable, RedisUnavailable
from tickwheel.durable.scheduler import Scheduler
from tickwheel.durable.store import ACQUIRED, PERMIT_WAIT, ClaimLimits, member_of

from ._loader_stats import LoaderStats
from ._rechecks import Rechecks
from ._tasks import TaskRegistry

__all__ = ["LIMITS_REFRESH", "Limiter"]

logger = logging.getLogger("tickwheel.durable")

# Seconds between two reads of the limits of record by one worker.
LIMITS_REFRESH = 1.0
# Fires a job the gate let through: the runner's fire (key, job, lease end, due).
Admit = Callable[[tuple[int, str], Job, float, "float | None"], None]
# A fired job at the gate: the runner's fire's arguments (key, job, lease end, due).
Gate = tuple[tuple[int, str], Job, float, "float | None"]
# A permit to release: (task, key, member, holder ("": handed, not taken), limits).
Handing = tuple[str, str, str, str, Limits]
# Grants kept before the stale ones are dropped (a grant a claim here never used: its
# job was claimed by another worker, cancelled, or claimed here after its window).
GRANTS_KEPT = 10_000
# A woken job leased here by take_woken (woken.lua's 1), told from a wake's 1 (due now).
LEASED_HERE = -1
# Wakes and leases the woken waiters of owned shards (shard -> (task, job id)) in one
# call a shard: woken.lua's codes by shard, None for a shard not taken there.
TakeWoken = Callable[[dict[int, list[tuple[str, str]]]], Awaitable[dict[int, "list[int] | None"]]]


class Limiter:
    """The permits of one worker's limited jobs.

    Args:
        scheduler: its store's limit calls and its ownership (fencing).
        registry: the tasks whose declared limits this worker writes.
        stats: where waits are counted.
        lease_ms: the run's lease: a permit's length, and half the recheck time.
        poke: starts the worker's next claim round at once (a woken job is due now).
        claim_now: claims the given shards at once (their woken jobs are due now);
            None: :attr:`poke`.
        take_woken: wakes and leases here the waiters of owned shards in one call a
            shard (the Claimer's; None: they are woken, then claimed).
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        stats: LoaderStats,
        *,
        lease_ms: int,
        poke: Callable[[], None] | None = None,
        claim_now: Callable[[set[int]], None] | None = None,
        take_woken: TakeWoken | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.calls = scheduler.store.limits
        self.registry = registry
        self.stats = stats
        self.hold_ms = lease_ms  # a permit's length
        self.recheck_ms = 2 * lease_ms  # a permit waiter's due, unless woken first
        self.poke = poke
        self.claim_now = claim_now
        self.take_woken = take_woken
        # A grant is used within half a permit of its release (s): the permit's deadline
        # is a whole permit after it, and the run's first extension pushes it.
        self.grant_s = lease_ms / 2000
        self.admit: Admit | None = None  # the runner's fire, set by the runner
        self.current: dict[str, Limits] = {}  # the limits of record, by task
        # The claim takes the permits of the tasks with a concurrency and no rate (one
        # Redis, Redis-only mode: Leases.claim and the store decide); False: the gate.
        self.in_claim = True
        self._claim_limits: ClaimLimits | None = None  # for_claim's, made at each read
        self.waiting: dict[str, int] = {}  # jobs waiting, by limited task (at the read)
        # Let through, firing again: the very claim (Job object) its gate admitted. A
        # fire that stops before its gate check (its lease ran out, its shard left)
        # leaves the entry; a later claim of the same id must not pass on it.
        self.admitted: dict[tuple[int, str], Job] = {}
        # Permits held here: the job, its limits and the holder its permit is held by
        # ("<epoch>:<attempt>"; "": the grant a release handed its job).
        self.held: dict[tuple[int, str], tuple[Job, Limits, str]] = {}
        # Permits this worker handed to waiters of the shards it owns, by (shard, id):
        # (task, key, loop time the release was sent: the grant's deadline is at least
        # a permit after it).
        self.granted: dict[tuple[int, str], tuple[str, str, float]] = {}
        self._loaded: asyncio.Future[None] | None = None  # the first declare and read
        self._read_at = 0.0  # loop time of the last read
        self._tasks: set[asyncio.Task[Any]] = set()  # gates and releases in flight
        # Batches (one pipeline of script calls each, one batch in flight at a time):
        # the jobs fired meanwhile wait for the next, so a claim of 1,000 limited jobs
        # costs a few round trips, not 1,000 calls.
        self._gates: list[Gate] = []  # fired jobs for the next batch of permits
        self._gating: asyncio.Task[None] | None = None  # sends the gates' batches
        self._releases: list[Handing] = []  # permits for the next batch of releases
        self._releasing: asyncio.Task[None] | None = None  # sends the releases' batches
        self.rechecks = Rechecks(self)  # the safety net of a lost wake

    # -- the limits of record -------------------------------------------------------

    async def start(self) -> None:
        """Write this worker's declarations, then read the limits of record (once; a
        failure is tried again at the next call or job).

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        if self._loaded is None or (self._loaded.done() and self._loaded.exception()):
            self._loaded = asyncio.ensure_future(self._declare())
        await asyncio.shield(self._loaded)

    async def _declare(self) -> None:
        await self.calls.declare(self.registry.limits())
        await self._read()

    async def _read(self) -> None:
        self._read_at = asyncio.get_running_loop().time()
        current = await self.calls.read()
        if current != self.current or self._claim_limits is None:
            # A rate's start must be counted when it starts, not up to a lookahead
            # before: a task with a rate keeps the gate.
            tasks = {t: lim for t, lim in current.items() if lim.concurrency and not lim.rate_n}
            self._claim_limits = ClaimLimits(self.hold_ms, self.recheck_ms, tasks)
        self.current = current
        # The metrics' waiting totals, per limited task (one pipeline; never per key).
        self.waiting = await self.calls.waiting(sorted(self.current))

    async def ready(self) -> None:
        """The limits of record are known (started once), and not older than
        ``LIMITS_REFRESH`` s (a refresh in the background)."""
        await self.start()
        loop = asyncio.get_running_loop()
        if loop.time() - self._read_at > LIMITS_REFRESH:
            self._read_at = loop.time()
            self.spawn(self._refresh())

    async def _refresh(self) -> None:
        # On a failure the last limits read stay in force until Redis answers again.
        with contextlib.suppress(RedisUnavailable, PostgresUnavailable):
            await self._read()

    # -- the permits the claim takes ----------------------------------------------------

    def for_claim(self) -> ClaimLimits | None:
        """The limits a claim takes its jobs' permits by (None: none, the gate)."""
        lim = self._claim_limits
        if not self.in_claim or lim is None or not lim.tasks:
            return None
        return lim

    def took(self, job: Job, sent: ClaimLimits) -> None:
        """The claim (sent ``sent``) leased ``job`` holding its permit (held by
        ``"<epoch>:<attempt>"``): it starts with no permit call (:meth:`gated`), and
        :meth:`finished` releases it."""
        key = (job.shard, job.id)
        self.held[key] = (job, sent.tasks[job.task], f"{job.epoch}:{job.attempt}")
        self.admitted[key] = job
        self.granted.pop(key, None)  # a grant it had: the claim took it (limits.lua's HSET)

    def unstarted(self, job: Job) -> None:
        """``job`` will not start here (handed back, shed, cancelled, its lease run
        out): the permit the claim took for it, if this very job holds it, is freed."""
        key = (job.shard, job.id)
        held = self.held.get(key)
        if held is not None and held[0] is job:
            self.admitted.pop(key, None)
            self.finished(job)

    # -- the gate (the runner's fire) ---------------------------------------------------

    def gated(self, key: tuple[int, str], job: Job, lease_end: float, due: float | None) -> bool:
        """True if ``job`` must take a permit first (it joins the next batch of gates,
        and fires again once through); False: it starts now. Called once per fired
        job. O(1)."""
        if self.admitted.pop(key, None) is job:
            return False
        loaded = self._loaded is not None and self._loaded.done()
        if loaded and job.task not in self.current:
            return False
        if job.duplicate:
            return False  # acked unrun: no run to limit
        if self.granted and self._on_grant(key, job):
            return False
        self._gates.append((key, job, lease_end, due))
        if self._gating is None:
            self._gating = self.spawn(self._gate_rounds())
        return True

    async def _gate_rounds(self) -> None:
        """Send the gates in batches until none is left: the jobs fired during one
        batch's round trip go together in the next (as the acks do)."""
        try:
            await asyncio.sleep(0)  # one loop turn: the other jobs of this tick join
            while self._gates:
                batch, self._gates = self._gates, []
                try:
                    await self.ready()
                    await self._gate(batch)
                except (RedisUnavailable, PostgresUnavailable) as exc:
                    self.stats.unavailable += len(batch)
                    logger.debug("%d job(s) left to the reaper at their permit (%s)",
                                 len(batch), exc)  # fmt: skip
                except Exception:
                    self.stats.errors += len(batch)
                    logger.exception("%d job(s) left to the reaper at their permit", len(batch))
        finally:
            self._gating = None

    async def _gate(self, batch: list[Gate]) -> None:
        """One batch: every permit taken in one pipeline (one round trip per node), the
        granted jobs fired, then the waits written (one pipeline per shard)."""
        limited: list[tuple[Gate, Limits]] = []
        for gate in batch:
            lim = self.current.get(gate[1].task)
            if lim is None:
                self._admit(gate)  # no limits of record (any more): it starts now
            else:
                limited.append((gate, lim))
        if not limited:
            return
        codes = await self.calls.acquire_many([(g[1], lim) for g, lim in limited], self.hold_ms)
        waits: dict[tuple[int, int], list[tuple[Job, int, bool]]] = {}
        owned = self.scheduler.ownership.owned
        for (gate, lim), (code, delay) in zip(limited, codes, strict=True):
            key, job = gate[0], gate[1]
            if code == ACQUIRED:
                self.held[key] = (job, lim, f"{job.epoch}:{job.attempt}")
                if owned.get(job.shard) != job.epoch:
                    self.finished(job)  # the shard left meanwhile: its run is not ours
                else:
                    self._admit(gate)
                continue
            permit = code == PERMIT_WAIT
            wait_ms = self.recheck_ms if permit else max(delay, 1)
            waits.setdefault((job.shard, job.epoch), []).append((job, wait_ms, permit))
        for (shard, epoch), jobs in waits.items():
            # Not awaited here: the next batch of gates goes meanwhile.
            self.spawn(self._wait(shard, epoch, jobs))

    async def _wait(self, shard: int, epoch: int, waits: list[tuple[Job, int, bool]]) -> None:
        """Hand the jobs of one shard back to due, to wait for a permit or a start (a
        failure leaves them to their pre-start leases: the reaper returns them)."""
        try:
            with self.scheduler.ownership.guard(shard, epoch):
                await self.calls.wait_many(shard, waits)
            self.stats.limit_waits += len(waits)
            if any((shard, job.id) in self.granted for job, _, _ in waits):
                # Handed a permit while its wait was in flight: its wait made it due now.
                self._claim({shard})
        except Fenced:
            pass  # counted, and the shard forgotten, by the loader's on_fenced
        except (RedisUnavailable, PostgresUnavailable) as exc:
            self.stats.unavailable += len(waits)
            logger.debug("%d waiting job(s) left to the reaper (%s)", len(waits), exc)
        except Exception:
            self.stats.errors += len(waits)
            logger.exception("%d waiting job(s) left to the reaper", len(waits))

    def _on_grant(self, key: tuple[int, str], job: Job) -> bool:
        """True if ``job`` starts on the permit a release here handed it (noted in
        :attr:`granted`): its task, key and window match, and it has no rate."""
        grant = self.granted.pop(key, None)
        if grant is None or grant[0] != job.task or grant[1] != job.key:
            return False
        lim = self.current.get(job.task)
        if lim is None or lim.rate_n or not lim.concurrency:
            return False  # a start is counted in its window by an acquire
        if asyncio.get_running_loop().time() - grant[2] >= self.grant_s:
            return False  # asks again: the handed permit may have run out
        self.held[key] = (job, lim, "")
        return True

    def _admit(self, gate: Gate) -> None:
        if self.admit is not None:
            self.admitted[gate[0]] = gate[1]
            self.admit(*gate)

    # -- the end of a run -----------------------------------------------------------

    def finished(self, job: Job) -> None:
        """A run of ``job`` ended here (its handler returned, failed or was stopped):
        its permit, if it holds one, joins the next batch of releases. O(1)."""
        held = self.held.pop((job.shard, job.id), None)
        if held is not None:
            self._releases.append((job.task, job.key, member_of(job), held[2], held[1]))
            if self._releasing is None:
                self._releasing = self.spawn(self._release_rounds())

    async def _release_rounds(self) -> None:
        """Send the releases in batches until none is left (as :meth:`_gate_rounds`)."""
        try:
            await asyncio.sleep(0)
            while self._releases:
                batch, self._releases = self._releases, []
                try:
                    await self._hand_on(batch)
                except (RedisUnavailable, PostgresUnavailable) as exc:
                    # The permits run out at their deadline; a waiter not woken is due
                    # at its recheck time.
                    self.stats.unavailable += 1
                    logger.debug("%d permit(s) left to their deadline (%s)", len(batch), exc)
                except Exception:
                    self.stats.errors += 1
                    logger.exception("%d permit(s) left to their deadline", len(batch))
        finally:
            self._releasing = None

    async def _hand_on(self, todo: list[Handing]) -> None:
        """Release the permits of ``todo`` (one pipeline); the waiters they were handed
        to are woken by a task of their own (:meth:`_wake`), while the next batch of
        releases goes."""
        sent = asyncio.get_running_loop().time()
        woken = await self.calls.release_many(todo, self.hold_ms)
        handed = [(r, w) for r, ws in zip(todo, woken, strict=True) for w in ws]
        if handed:
            self.spawn(self._wake(handed, sent))

    async def _wake(self, handed: list[tuple[Handing, str]], sent: float) -> None:
        """Make each waiter handed a permit due now; a waiter that no longer waits
        (cancelled, done, moved) frees its handed permit in the next batch of releases.
        The waiters of shards this worker owns start on their grants (released at loop
        time ``sent``): leased here in the same call (:attr:`take_woken`, woken.lua),
        or claimed at once. The others: one pipeline of waits.lua calls. A failure
        leaves the waiters to their recheck time and the permits to their deadline."""
        owned = self.scheduler.ownership.owned
        granted = self.granted
        if len(granted) > GRANTS_KEPT:
            self._forget_grants(sent)
        direct: dict[int, list[int]] = {}  # shard -> indexes into handed
        plain: list[int] = []
        for i, (r, waiter) in enumerate(handed):
            text, _, job_id = waiter.partition("|")
            shard = int(text)
            if shard in owned:
                granted[(shard, job_id)] = (r[0], r[1], sent)  # before it can fire
                if self.take_woken is not None:
                    direct.setdefault(shard, []).append(i)
                    continue
            plain.append(i)
        codes = [0] * len(handed)
        try:
            if direct:
                items = {
                    shard: [(handed[i][0][0], handed[i][1].partition("|")[2]) for i in ids]
                    for shard, ids in direct.items()
                }
                assert self.take_woken is not None
                for shard, got in (await self.take_woken(items)).items():
                    if got is None:
                        plain += direct[shard]  # not taken here: woken plainly
                    else:
                        for i, code in zip(direct[shard], got, strict=True):
                            codes[i] = LEASED_HERE if code == 1 else code
            if plain:
                woken = await self.calls.wake_many([(handed[i][0][0], handed[i][1]) for i in plain])
                for i, code in zip(plain, woken, strict=True):
                    codes[i] = code
        except (RedisUnavailable, PostgresUnavailable) as exc:
            self.stats.unavailable += 1
            logger.debug("%d wake(s) left to their recheck time (%s)", len(handed), exc)
            return
        except Exception:
            self.stats.errors += 1
            logger.exception("%d wake(s) left to their recheck time", len(handed))
            return
        stale = 0
        due_now: set[int] = set()  # owned shards with a woken job to claim
        for (r, waiter), code in zip(handed, codes, strict=True):
            text, _, job_id = waiter.partition("|")
            if code == 0:
                stale += 1
                self._releases.append((r[0], r[1], waiter, "", r[4]))
                granted.pop((int(text), job_id), None)
                continue
            self.stats.limit_wakes += 1
            if code != LEASED_HERE and int(text) in owned:
                # Due now, or still leased (code 2: its wait, in flight, makes it due
                # now; claimed when it lands, see _wait, or here if it landed already).
                due_now.add(int(text))
        if stale and self._releasing is None:
            self._releasing = self.spawn(self._release_rounds())
        if due_now:
            self._claim(due_now)
        elif self.poke is not None and stale < len(handed) and self.claim_now is None:
            self.poke()

    def _claim(self, shards: set[int]) -> None:
        """Claim ``shards`` now: woken jobs are due there."""
        if self.claim_now is not None:
            self.claim_now(shards)
        elif self.poke is not None:
            self.poke()

    def _forget_grants(self, now: float) -> None:
        """Drop the grants past their window (never used here)."""
        for key in [k for k, g in self.granted.items() if now - g[2] >= self.grant_s]:
            del self.granted[key]

    def recheck_soon(self) -> None:
        """After a claim round: the due flow keys' rechecks (:class:`Rechecks`)."""
        self.rechecks.soon()

    def release_later(self, items: list[Handing]) -> None:
        """Free ``items`` (handed permits whose job waits no more) in the next batch
        of releases."""
        if items:
            self._releases += items
            if self._releasing is None:
                self._releasing = self.spawn(self._release_rounds())

    async def extend(self, job: Job) -> None:
        """Push the permit ``job``'s run holds (if any) with its lease."""
        held = self.held.get((job.shard, job.id))
        if held is not None:
            await self.calls.extend(job, held[1], self.hold_ms, held[2])

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def settle(self) -> None:
        """Wait for the gates and releases in flight (a drain, before the worker ends)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
