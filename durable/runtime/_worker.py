"""The worker: one process's loader, reaper and fair share of the shards.

Ground rules:

- Workers of a namespace heartbeat into one member set (``{ns}:workers``, scored by
  Redis time, see ``store/lua/members.lua``); a member whose heartbeat is older than the
  member TTL is gone. Each worker owns at most ``ceil(shards / live workers)`` shards:
  it takes free ones up to that share and gives back extras, so the shards spread
  again when a worker joins or dies.
- A shard is given back only after its loaded, unfired jobs were released (under the
  loader's lock, so no claim lands in between) and its running tasks finished (up to the
  drain timeout). That drain runs beside the balancer, which goes on renewing the other
  shards, and the leaving one, so a long drain costs no shard its owner. A fenced shard
  is dropped with its loaded jobs, which its new owner gets back from the reaper.
- The balancer and the reaper outlive any error: Redis unreachable or refusing for now
  is a warning, anything else is logged with its traceback, and the next round runs.
- Every balancing round also publishes the worker's counters (claims, acks, retries,
  dead letters, reaps, the lateness histogram) as one small JSON document under
  ``{ns}:wstats:<token>`` with the member TTL, for the dashboard: one SET every few
  seconds, off the job path; a dead worker's stats expire with its membership. The
  member set and the document's shape are the store's (``store/_workers.py``).
- Shutdown (:meth:`Worker.stop`, SIGTERM in the CLI): stop claiming, release what is
  loaded but not fired at once, let running tasks finish (up to the drain timeout),
  then cancel the handlers still running and release their jobs unrun (same attempt)
  for another worker, give every shard back, leave the member set.
- A cancel of a leased job publishes its id (cancel.lua, on ``Keys.cancels``); each
  worker listens on one pub/sub connection and stops that job's handler if it runs
  there. A message missed (the connection was down) is made up for by the handler's
  next lease extension, which finds the lease gone and stops it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import zlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from tickwheel.durable.model import (
    PRIORITY_AGING,
    Fenced,
    JobState,
    NotOwner,
    ReapResult,
    RedisUnavailable,
    check_aging,
    finite_seconds_ms,
)
from tickwheel.durable.scheduler import DEFAULT_LEASE, RENEW_FRACTION, Scheduler
from tickwheel.durable.store import STATS_COUNTERS, STATS_VERSION
from tickwheel.wheel import TimingWheel

from ._history import HistoryRecorder
from ._loader import (
    DEFAULT_LIMIT,
    DEFAULT_LOOKAHEAD,
    DEFAULT_MAX_RUNNING,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_START_MARGIN,
    Loader,
    LoaderStats,
)
from ._logs import OUTAGE_ERRORS, Outages
from ._reaper import DEFAULT_REAP_INTERVAL, Reaper
from ._rounds import open_when_reachable, run_rounds
from ._stats_publisher import StatsPublisher
from ._stream import Publisher
from ._tasks import TaskRegistry, check_timeout

__all__ = ["DEFAULT_DRAIN_TIMEOUT", "STATS_COUNTERS", "STATS_VERSION", "Worker"]

logger = logging.getLogger("tickwheel.durable")

# How long (s) a stopping worker lets running tasks finish before cancelling them
# (a cancelled task's lease expires and the job runs again elsewhere). Below the usual
# 30 s SIGKILL grace of process supervisors (Kubernetes, systemd's default 90 s).
DEFAULT_DRAIN_TIMEOUT = 20.0
# Postgres mode: seconds between reconciles of the Redis index from PostgreSQL. Each reads
# every pending row (docs/postgres.md has the cost per million), so not too often; the
# relay and the claim's check against PostgreSQL cover the time between.
DEFAULT_RECONCILE_INTERVAL = 300.0


class Worker:
    """Run durable jobs of a namespace in this process, sharing shards with others.

    Args:
        scheduler: the namespace; its ``ownership`` TTL is also the member TTL.
        registry: the tasks, by name.
        lookahead: as for :class:`Loader`.
        lease: as for :class:`Loader`.
        limit: as for :class:`Loader`.
        poll_interval: as for :class:`Loader`.
        max_running: as for :class:`Loader`.
        start_margin: as for :class:`Loader` (the pre-start lease past the lookahead).
        priority_aging: as for :class:`Loader` (60 s: late jobs first; None: no aging).
        reap_interval: seconds between reaper rounds.
        drain_timeout: seconds running tasks get at shutdown; then their handlers are
            cancelled and their jobs released unrun (same attempt).
        default_timeout: seconds a handler may run when its task sets no ``timeout``
            of its own (None: no limit); a run past it fails with the reason
            ``timeout`` (retried with backoff, dead after ``max_attempts``).
        publisher: publish due jobs to this broker instead of running tasks.
        reconcile_interval: Postgres mode: seconds between reconciles of the Redis
            index from PostgreSQL (one also runs at start). Only one worker of the
            namespace reconciles at a time (an advisory lock); the others skip that
            round. The relay of the outbox runs at every commit notification and every
            second.
        history: record each attempt's end (outcome, times, error's first line) in its
            shard's capped history stream, for the dashboard's job and history pages
            (written in one batch per balancing round, off the job path). Opt-in: with
            no-op tasks it costs ~20 % more worker CPU per job
            (``bench/probes/history_cost.py``).

    Raises:
        TypeError, ValueError: naming a bad parameter.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        registry: TaskRegistry,
        *,
        lookahead: float | timedelta = DEFAULT_LOOKAHEAD,
        lease: float | timedelta = DEFAULT_LEASE,
        limit: int = DEFAULT_LIMIT,
        poll_interval: float | timedelta = DEFAULT_POLL_INTERVAL,
        max_running: int = DEFAULT_MAX_RUNNING,
        reap_interval: float | timedelta = DEFAULT_REAP_INTERVAL,
        drain_timeout: float | timedelta = DEFAULT_DRAIN_TIMEOUT,
        publisher: Publisher | None = None,
        reconcile_interval: float | timedelta = DEFAULT_RECONCILE_INTERVAL,
        default_timeout: float | None = None,
        start_margin: float | timedelta | None = DEFAULT_START_MARGIN,
        history: bool = False,
        priority_aging: float | timedelta | None = PRIORITY_AGING,
    ) -> None:
        given: object = scheduler  # typed, but a redis client is a common slip
        if not isinstance(given, Scheduler):
            kind = type(given).__name__
            raise TypeError(
                f"scheduler must be a Scheduler (made on a redis.asyncio client), got {kind}"
            )
        if not isinstance(registry, TaskRegistry):
            raise TypeError(f"registry must be a TaskRegistry, got {registry!r}")
        self.scheduler = scheduler  # the namespace
        self.registry = registry  # tasks by name
        self.ownership = scheduler.ownership  # the shards this worker owns
        self.token = self.ownership.token  # member id, also the owner token
        self.members_key = scheduler.keys.workers  # ZSET token -> beat
        self.stats_key = scheduler.keys.worker_stats(self.token)  # STRING, JSON with a TTL
        self.stats_publisher = StatsPublisher(self)  # its stats document and chart samples
        self._loader_args: dict[str, Any] = {
            "lookahead": lookahead,
            "lease": lease,
            "limit": limit,
            "poll_interval": poll_interval,
            "publisher": publisher,
            "max_running": max_running,
            "default_timeout": check_timeout(default_timeout),
            "start_margin": start_margin,
            "priority_aging": check_aging(priority_aging),
        }
        if not isinstance(history, bool):
            raise TypeError(f"history must be a bool, got {history!r}")
        self.history = history  # keep the shards' history of finished attempts
        self.reap_interval_ms = finite_seconds_ms("reap_interval", reap_interval, minimum_ms=1)
        self.drain_timeout_ms = finite_seconds_ms("drain_timeout", drain_timeout)
        self.reconcile_interval_ms = finite_seconds_ms(
            "reconcile_interval", reconcile_interval, minimum_ms=1
        )
        self.outages = Outages()  # store outages of its loops: logged when each starts, ends
        self._loader_args["outages"] = self.outages
        self.loader: Loader | None = None  # set while running
        self.live = 0  # live workers at the last heartbeat
        self._stop = asyncio.Event()  # set by stop()
        self.listening = asyncio.Event()  # set while subscribed to cancels (not reconnecting)
        # Shards being given back (their tasks drain): shard -> (epoch, the give-back task)
        self._leaving: dict[int, tuple[int, asyncio.Task[None]]] = {}
        # Where to look for free shards first: by token, so starting workers spread out.
        self._offset = zlib.crc32(self.token.encode()) % scheduler.keys.shards

    @property
    def shards_lost(self) -> int:
        """Shards this worker lost to another owner (fenced, or its renewal refused)."""
        return self.ownership.counters.shards_lost

    def stop(self) -> None:
        """Ask :meth:`run` to shut down gracefully (safe from a signal handler)."""
        self._stop.set()

    async def heartbeat(self, join: bool = True) -> int:
        """Beat (or leave with ``join=False``); return the live worker count.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        board = self.scheduler.workers
        self.live = await board.heartbeat(self.token, self.ownership.ttl_ms, join)
        return self.live

    def share(self) -> int:
        """This worker's fair share: ``ceil(shards / live workers)``."""
        return math.ceil(self.scheduler.keys.shards / max(self.live, 1))

    def stats_document(self) -> dict[str, Any]:
        """What :meth:`publish_stats` writes (``_stats_publisher.py`` has its shape)."""
        return self.stats_publisher.document()

    async def publish_stats(self) -> None:
        """Write the stats document (one SET with the member TTL) and, every
        ``SAMPLE_S`` seconds, a chart sample (one XADD). Called by the balancer, off
        the job path.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        await self.stats_publisher.publish()

    async def balance_once(self) -> None:
        """Heartbeat, renew owned shards, then take free shards or give back extras.

        Raises:
            RedisUnavailable: if Redis cannot be reached.
        """
        own = self.ownership
        await self.heartbeat()
        for shard in list(own.owned):
            # A fenced renewal drops the shard; the ownership tells the loader.
            with contextlib.suppress(NotOwner):  # dropped meanwhile (a fenced claim, ack)
                await own.renew(shard)
        for shard, (epoch, _) in list(self._leaving.items()):
            # Still ours while its tasks drain: their acks need the epoch unchanged.
            with contextlib.suppress(Fenced):
                await own.renew_leaving(shard, epoch)
        share = self.share()
        extras = sorted(own.owned)[share:]
        for shard in extras:
            self._start_give_back(shard)
        shards = self.scheduler.keys.shards
        for i in range(shards):
            if len(own.owned) >= share or self._stop.is_set():
                break
            shard = (self._offset + i) % shards
            if shard not in own.owned and shard not in self._leaving:
                taken = await own.take(shard)
                if taken:
                    logger.info("took shard %d (epoch %d)", shard, taken, extra={"shard": shard})

    def _start_give_back(self, shard: int) -> None:
        epoch = self.ownership.owned.get(shard)
        if epoch is None or shard in self._leaving:
            return
        task = asyncio.ensure_future(self._leave(shard))
        self._leaving[shard] = (epoch, task)
        task.add_done_callback(lambda _: self._leaving.pop(shard, None))

    async def give_back(self, shard: int) -> None:
        """Stop claiming ``shard``, release its loaded jobs, let its running tasks finish
        (up to the drain timeout: giving back fences their acks), then give it back."""
        own = self.ownership
        if self.loader is None:
            await own.give_back(shard)
            return
        async with self.loader.lock:  # no claim of it is in flight
            epoch = own.owned.pop(shard, None)  # and none starts: the loader skips it
            if epoch is None:
                return
            released = await self.loader.release_shard(shard)
        logger.info(
            "giving shard %d back (epoch %d): %d loaded job(s) released, draining its tasks",
            shard,
            epoch,
            released,
            extra={"shard": shard},
        )
        await self.loader.drain(self.drain_timeout_ms / 1000, shard=shard)
        if await own.give_back_leaving(shard, epoch):
            logger.info("gave shard %d back", shard, extra={"shard": shard})

    async def _balance(self) -> None:
        async def round_() -> None:
            await self.balance_once()
            await self.publish_stats()

        period = self.ownership.ttl_ms / 1000 / RENEW_FRACTION
        await run_rounds(
            round_, stop=self._stop, interval=period, what="balancing", outages=self.outages
        )

    async def _reap(self, reaper: Reaper) -> None:
        async def round_() -> None:
            for result in await reaper.reap_once():
                await self._log_reaped(result)
                if self.loader is not None and self.loader.stats.history is not None:
                    self.loader.stats.history.reaped(result)

        interval = self.reap_interval_ms / 1000
        await run_rounds(
            round_, stop=self._stop, interval=interval, what="reaper", outages=self.outages
        )

    async def _log_reaped(self, result: ReapResult) -> None:
        """Log what a reap did: one WARNING per shard for the expired leases it returned
        to due, one ERROR per job it dead-lettered (looked up for its task and attempts;
        a job changed meanwhile is logged by id)."""
        shard = result.shard
        if result.requeued:
            shown = ", ".join(repr(i) for i in result.requeued[:5])
            more = f" and {len(result.requeued) - 5} more" if len(result.requeued) > 5 else ""
            logger.warning(
                "%d expired lease(s) of shard %d due again (their worker died or stalled): %s%s",
                len(result.requeued),
                shard,
                shown,
                more,
                extra={"shard": shard},
            )
        for job_id in result.dead:
            info = await self.scheduler.get(job_id)
            if info is None or info.state is not JobState.DEAD:
                logger.error(
                    "job %r dead-lettered: its lease expired at its last attempt",
                    job_id,
                    extra={"job_id": job_id, "shard": shard, "reason": "lease expired"},
                )
                continue
            logger.error(
                "job %r dead-lettered (task %s, attempt %d/%d): its lease expired at its last"
                " attempt",
                job_id,
                info.task,
                info.attempt,
                info.max_attempts,
                extra={
                    "job_id": job_id,
                    "task": info.task,
                    "attempt": info.attempt,
                    "shard": shard,
                    "reason": "lease expired",
                },
            )

    async def _reconcile(self) -> None:
        """Postgres mode: reconcile at start, then every ``reconcile_interval``."""
        while not self._stop.is_set():
            try:
                # One worker at a time: the others skip this round (an advisory lock).
                result = await self.scheduler.reconcile(if_free=True)
                self.outages.ok("reconcile")
                if result.skipped:
                    logger.debug("reconcile skipped (another one runs)")
                else:
                    logger.info("reconciled %s", result)
            except OUTAGE_ERRORS as exc:
                self.outages.failed("reconcile", exc)
                logger.debug("reconcile failed (%s)", exc)
            except Exception:  # the next round may do better
                logger.exception("reconcile failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.reconcile_interval_ms / 1000)

    async def run(self) -> LoaderStats:
        """Run until :meth:`stop`; then shut down gracefully.

        Returns:
            The loader's counters.

        A store that does not answer at the start is waited for (logged once), as
        later outages are; :meth:`stop` meanwhile ends the run at once.

        Raises:
            ShardCountMismatch, RedisConfigError: from :meth:`Scheduler.open`.
        """
        if not await open_when_reachable(
            self.scheduler.open, stop=self._stop, outages=self.outages
        ):
            return LoaderStats()
        wheel = TimingWheel()
        loader = self.loader = Loader(self.scheduler, self.registry, wheel, **self._loader_args)
        if self.history:
            loader.stats.history = HistoryRecorder()
        reaper = Reaper(
            self.ownership, interval=self.reap_interval_ms / 1000, tracer=self.scheduler.tracer
        )
        balance = asyncio.ensure_future(self._balance())
        loading = asyncio.ensure_future(loader.run())
        reaping = asyncio.ensure_future(self._reap(reaper))
        listening = asyncio.ensure_future(self._listen_cancels(loader))
        pg = self.scheduler.pg
        extra: list[asyncio.Future[None]] = []
        if pg is not None:  # Postgres mode: the outbox relay, and reconcile
            extra.append(asyncio.ensure_future(pg.run_relay(self.scheduler, self._stop)))
            extra.append(asyncio.ensure_future(self._reconcile()))
        try:
            await self._stop.wait()
        finally:
            await self._shutdown(loader, balance, loading, reaping)
            listening.cancel()
            # Bounded: redis-py may swallow a cancellation that lands inside a command.
            await asyncio.wait([listening], timeout=1.0)
            loader.close()
            if extra:  # both end at the stop event; a reconcile part-way is cut short
                _, late = await asyncio.wait(extra, timeout=self.drain_timeout_ms / 1000)
                for task in late:
                    task.cancel()
                if late:
                    await asyncio.wait(late)
            for task in extra:
                if not task.cancelled():
                    await _logged(task, "postgres relay and reconcile")
            wheel.close()
        return loader.stats

    async def _listen_cancels(self, loader: Loader) -> None:
        """Stop the handler of each job a cancel removed while leased (see the module
        docstring); reconnect after a failure, a second later. Runs until cancelled."""
        client = self.scheduler.store.client
        channel = self.scheduler.keys.cancels
        # Until cancelled; or, should a cancellation be swallowed, once stopped and idle.
        while not self._stop.is_set() or (loader.running > 0):
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(channel)
                self.listening.set()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        loader.stop_job(data.decode() if isinstance(data, bytes) else data)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the lease extension covers what is missed
                logger.debug("cancel listener: %r; listening again in 1 s", exc)
                await asyncio.sleep(1.0)
            finally:
                self.listening.clear()
                with contextlib.suppress(Exception):
                    await asyncio.shield(pubsub.aclose())

    async def _shutdown(
        self,
        loader: Loader,
        balance: asyncio.Future[None],
        loading: asyncio.Future[None],
        reaping: asyncio.Future[None],
    ) -> None:
        self._stop.set()
        loader.stop_claiming()
        # Each step runs whatever the one before raised (see _logged).
        steps: tuple[tuple[Callable[[], Awaitable[object]], str], ...] = (
            (lambda: balance, "balancer"),
            (lambda: loading, "loader"),
            (lambda: reaping, "reaper"),
            (loader.release_all, "releasing loaded jobs"),
            (lambda: loader.drain(self.drain_timeout_ms / 1000), "draining tasks"),
            (lambda: asyncio.gather(*(t for _, t in self._leaving.values())), "give-backs"),
            (self._give_back_all, "giving shards back"),
            (lambda: self.heartbeat(join=False), "leaving the member set"),
            (self._unpublish, "removing its stats"),
        )
        for step, what in steps:
            await _logged(step(), what)

    async def _give_back_all(self) -> None:
        shards = sorted(self.ownership.owned)
        await self.ownership.give_back_all()
        if shards:
            logger.info("gave shard(s) %s back at shutdown", ", ".join(map(str, shards)))

    async def _unpublish(self) -> None:
        try:  # what it counted since its last chart sample
            await self.stats_publisher.publish(final=True)
        finally:
            await self.scheduler.workers.unpublish(self.token)

    async def _leave(self, shard: int) -> None:
        """:meth:`give_back` in a task of its own (a drain can take a while)."""
        await _logged(self.give_back(shard), f"giving shard {shard} back")


async def _logged(step: Awaitable[object], what: str) -> None:
    """Await ``step``; log (not raise) what it raised: one failed step must not stop the
    next (a shutdown that stopped at the first error would leave jobs leased and shards
    owned until they expire)."""
    try:
        await step
    except RedisUnavailable as exc:
        logger.warning("%s without Redis (%s)", what, exc)
    except Exception:
        logger.exception("%s failed", what)
