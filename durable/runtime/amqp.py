"""The publish handoff over RabbitMQ (AMQP 0-9-1; ``pip install tickwheel[rabbitmq]``).

:class:`RabbitPublisher` publishes each due job to an exchange as a persistent message
with ``mandatory`` set, on a channel in confirm mode, and returns once the broker
confirmed it (``basic.ack``): the worker clears the lease only then. A ``basic.nack``,
a message returned as unroutable (no queue bound for its routing key), a timeout or a
lost connection raise :class:`BrokerUnavailable`, and the job is published again. The
AMQP ``message_id`` is ``<job id>:<nominal ms>``; RabbitMQ does not deduplicate, so
:class:`RabbitConsumer` drops a second message of an occurrence.

Publishes are pipelined: each due job is published by its own runner task, so up to
``max_running`` publishes wait for their confirms at once on one channel.

The message format is ``docs/brokers.md``'s (``_handoff.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import aio_pika
import aio_pika.abc
import aiormq.abc
import aiormq.exceptions
from pamqp import commands as spec
from pamqp.commands import Basic

from tickwheel.durable.model import BrokerMisconfigured, BrokerUnavailable, Job
from tickwheel.durable.scheduler import Scheduler, make_tracing
from tickwheel.durable.store import Client

from ._handoff import DONE, DUPLICATE, FAILED, Dedup, HandoffConsumer, encode_message, message_id
from ._tasks import TaskRegistry

__all__ = ["RabbitConsumer", "RabbitPublisher"]

logger = logging.getLogger("tickwheel.durable")

# Seconds a publish may wait for its confirm (and a connection for its server).
DEFAULT_TIMEOUT = 5.0
# Seconds between two tries to reconnect: a publish in between fails at once.
RECONNECT_PAUSE = 0.25
# AMQP delivery mode 2: the broker writes the message to disk.
_PERSISTENT = 2
# What a broker that is down, restarting or cut off raises.
_DOWN = (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError, RuntimeError)


async def _connect(url: str, wait: float) -> aio_pika.abc.AbstractConnection:
    """One connection (not the robust kind: the publisher reconnects on next use).

    Raises:
        BrokerMisconfigured: if the credentials are refused.
        BrokerUnavailable: if the broker cannot be reached.
    """
    try:
        return await aio_pika.connect(url, timeout=wait)
    except (
        aiormq.exceptions.ProbableAuthenticationError,
        aiormq.exceptions.AuthenticationError,
        aiormq.exceptions.ConnectionNotAllowed,
    ) as exc:
        raise BrokerMisconfigured(f"amqp: credentials or vhost refused ({exc})") from None
    except _DOWN as exc:
        raise BrokerUnavailable(f"amqp broker unavailable: {exc!r}") from None


class RabbitPublisher:
    """Publish jobs to a RabbitMQ exchange; :meth:`publish` returns once confirmed.

    Args:
        url: ``amqp://user:password@host:port/vhost``.
        exchange: the exchange (it must exist: see :meth:`open`).
        routing_key: the routing key of every message; None: the job's task name.
        timeout: seconds a publish waits for its confirm.
    """

    def __init__(
        self,
        url: str,
        exchange: str,
        *,
        routing_key: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(exchange, str):
            raise TypeError(f"exchange must be a str, got {exchange!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.url = url
        self.exchange = exchange  # "" is the default exchange (routing key = queue)
        self.routing_key = routing_key
        self.timeout = timeout
        self.published = 0  # confirmed messages
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._exchange: aio_pika.abc.AbstractExchange | None = None
        self._raw: aiormq.abc.AbstractChannel | None = None  # its channel, aiormq's
        self._lock = asyncio.Lock()  # one (re)connect at a time
        self._next_try = 0.0  # loop time before which a reconnect is not tried

    async def open(self) -> None:
        """Connect, open a confirm channel and check that the exchange exists.

        Raises:
            BrokerUnavailable: if the broker cannot be reached.
            BrokerMisconfigured: if the exchange does not exist or the credentials
                are refused.
        """
        async with self._lock:
            if self._exchange is not None:
                return
            conn = await _connect(self.url, self.timeout)
            try:
                channel = await conn.channel(publisher_confirms=True, on_return_raises=False)
                if self.exchange:
                    ex = await channel.get_exchange(self.exchange, ensure=True)
                else:
                    ex = channel.default_exchange
                raw = await channel.get_underlay_channel()
            except aiormq.exceptions.ChannelNotFoundEntity:
                await conn.close()
                raise BrokerMisconfigured(
                    f"amqp: no exchange {self.exchange!r} (declare it first)"
                ) from None
            except _DOWN as exc:
                await conn.close()
                raise BrokerUnavailable(f"amqp broker unavailable: {exc!r}") from None
            self._conn, self._exchange, self._raw = conn, ex, raw

            def lost(*_: object) -> None:
                if self._conn is conn:  # the next publish reconnects
                    self._exchange = None

            conn.close_callbacks.add(lost)

    async def _ready(self) -> aio_pika.abc.AbstractExchange:
        ex, conn = self._exchange, self._conn
        if ex is not None and conn is not None and not conn.is_closed:
            return ex  # (a lost connection's callback cleared _exchange)
        loop = asyncio.get_running_loop()
        if loop.time() < self._next_try:
            raise BrokerUnavailable("amqp broker unavailable (reconnecting)")
        self._next_try = loop.time() + RECONNECT_PAUSE
        await self._drop()
        await self.open()
        assert self._exchange is not None
        return self._exchange

    async def publish(self, job: Job) -> None:
        """Publish ``job`` (persistent, mandatory) and wait for the broker's confirm.

        Raises:
            BrokerUnavailable: a nack, an unroutable message, no confirm within the
                timeout, or no connection (the message may be queued or not: the job
                is published again and the consumer drops the copy).
        """
        exchange = await self._ready()
        body, headers = encode_message(job)
        # The properties as the wire has them: aio_pika.Message costs more CPU than the
        # rest of a publish (profiled at 5,000 jobs/s), and adds nothing here.
        properties = spec.Basic.Properties(
            headers=headers,  # type: ignore[arg-type]
            message_id=message_id(job.id, job.nominal_ms),
            delivery_mode=_PERSISTENT,
            content_type="application/json" if headers["tickwheel-flags"] == "1" else None,
        )
        key = self.routing_key if self.routing_key is not None else job.task
        try:
            channel = self._raw
            assert channel is not None  # set with _exchange
            result: Any = await channel.basic_publish(
                body,
                exchange=exchange.name,
                routing_key=key,
                properties=properties,
                mandatory=True,
                timeout=self.timeout,
            )
        except aiormq.exceptions.DeliveryError as exc:  # a basic.nack: the channel is fine
            raise BrokerUnavailable(f"amqp publish of {job.id!r} nacked: {exc!r}") from None
        except _DOWN as exc:
            if self._exchange is exchange:
                self._exchange = None  # whatever broke, the next publish reconnects
            raise BrokerUnavailable(f"amqp publish of {job.id!r} not confirmed: {exc!r}") from None
        if isinstance(result, Basic.Ack):
            self.published += 1
            return
        if isinstance(result, Basic.Nack):
            raise BrokerUnavailable(f"amqp publish of {job.id!r} nacked by the broker")
        raise BrokerUnavailable(
            f"amqp publish of {job.id!r} returned: no queue bound to exchange"
            f" {self.exchange!r} for routing key {key!r}"
        )

    async def _drop(self) -> None:
        conn, self._conn, self._exchange = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(*_DOWN):
                async with asyncio.timeout(self.timeout):
                    await conn.close()

    async def close(self) -> None:
        """Close the connection (an unconfirmed job keeps its lease)."""
        await self._drop()


class RabbitConsumer(HandoffConsumer):
    """Run published jobs from a RabbitMQ queue.

    Each message's task runs with the :class:`TaskContext` a worker gives it. A message
    is acked once its task returned (or it was a duplicate), requeued when the task
    raised, rejected (dead-lettered, if the queue has a dead-letter exchange) when no
    retry mends it.

    Args:
        url: ``amqp://user:password@host:port/vhost``.
        queue: the queue (it must exist: see :meth:`open`).
        registry: the tasks.
        dedup: a Redis for the dedup record shared by every consumer of ``queue``;
            None keeps it in this process.
        dedup_ttl: seconds an occurrence's owner is remembered in Redis.
        scheduler: given to each TaskContext (follow-up jobs).
        tracing: run each task in an OpenTelemetry ``CONSUMER`` span, the child of the
            message's ``traceparent`` (needs ``tickwheel[otel]``).
        batch: messages taken per round (and the channel's prefetch).
    """

    def __init__(
        self,
        url: str,
        queue: str,
        registry: TaskRegistry,
        *,
        dedup: Client | None = None,
        dedup_ttl: float | timedelta = 3600.0,
        scheduler: Scheduler | None = None,
        tracing: bool = False,
        batch: int = 100,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if type(batch) is not int or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        dedup_record = Dedup(dedup, f"tickwheel:amqp:{queue}", queue, ttl=dedup_ttl)
        # Spans name the queue as their tickwheel.namespace.
        super().__init__(registry, dedup_record, scheduler, make_tracing(tracing, queue))
        self.url = url
        self.queue = queue
        self.batch = batch
        self.timeout = timeout
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        self._lost = False  # the connection closed under us: reopen on next process()

    async def open(self) -> None:
        """Connect and start consuming the queue.

        Raises:
            BrokerUnavailable: if the broker cannot be reached.
            BrokerMisconfigured: if the queue does not exist or the credentials are
                refused.
        """
        if self._conn is not None and not self._conn.is_closed and not self._lost:
            return
        await self.close()
        self._inbox = asyncio.Queue()  # what a dead channel delivered is redelivered
        conn = await _connect(self.url, self.timeout)
        try:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=self.batch)
            queue = await channel.get_queue(self.queue, ensure=True)
            await queue.consume(self._inbox.put)

            def lost(*_: object) -> None:
                self._lost = True

            conn.close_callbacks.add(lost)
        except aiormq.exceptions.ChannelNotFoundEntity:
            await conn.close()
            raise BrokerMisconfigured(f"amqp: no queue {self.queue!r} (declare it first)") from None
        except _DOWN as exc:
            await conn.close()
            raise BrokerUnavailable(f"amqp broker unavailable: {exc!r}") from None
        self._conn, self._lost = conn, False

    async def process(self, block: float | None = None) -> int:
        """Take up to ``batch`` delivered messages (waiting up to ``block`` s for the
        first), run their tasks at once, and ack each; returns how many tasks ran.

        Raises:
            BrokerUnavailable: if the broker cannot be reached.
            RedisUnavailable: if the dedup Redis cannot be reached (nothing acked).
        """
        if self._conn is None or self._conn.is_closed or self._lost:
            await self.open()
        inbox = self._inbox
        msgs: list[aio_pika.abc.AbstractIncomingMessage] = []
        if inbox.empty():
            if not block:
                return 0
            try:
                msgs.append(await asyncio.wait_for(inbox.get(), block))
            except TimeoutError:
                return 0
        while len(msgs) < self.batch and not inbox.empty():
            msgs.append(inbox.get_nowait())
        outcomes = await asyncio.gather(*(self._consume(m.body, m.headers) for m in msgs))
        ran = 0
        try:
            if all(outcome in (DONE, DUPLICATE) for outcome in outcomes):
                # One basic.ack for the round: every earlier delivery of this channel
                # was settled in an earlier round, so "multiple" acks exactly these.
                await msgs[-1].ack(multiple=True)
                return outcomes.count(DONE)
            for msg, outcome in zip(msgs, outcomes, strict=True):
                if outcome in (DONE, DUPLICATE):
                    await msg.ack()
                    ran += outcome == DONE
                elif outcome == FAILED:
                    await msg.nack(requeue=True)
                else:
                    await msg.reject(requeue=False)
        except _DOWN as exc:
            # Not acked: the broker redelivers; the dedup lets the owner run again.
            raise BrokerUnavailable(f"amqp ack failed: {exc!r}") from None
        return ran

    async def close(self) -> None:
        """Close the connection (unacked messages are redelivered)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(*_DOWN):
                async with asyncio.timeout(self.timeout):
                    await conn.close()
