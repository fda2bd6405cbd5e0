"""The publish handoff over NATS JetStream (``pip install tickwheel[nats]``).

:class:`NatsPublisher` hands each due job to a JetStream stream and returns once the
stream acked it, so the worker clears the lease only then. The message id
(``Nats-Msg-Id``) is ``<job id>:<nominal ms>``: a job published again within the
stream's duplicate window is stored once (the ack says ``duplicate``; counted in
:attr:`NatsPublisher.duplicates`). :class:`NatsConsumer` reads the stream with a durable
pull consumer and runs the registry's tasks, dropping a duplicate past that window.

Publishes are pipelined: each due job is published by its own runner task, so up to
``max_running`` publishes wait for their acks at once on one connection.

The message format is ``docs/brokers.md``'s (``_handoff.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import nats
import nats.errors
import nats.js
import nats.js.api
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from tickwheel.durable.model import BrokerMisconfigured, BrokerUnavailable, Job
from tickwheel.durable.scheduler import Scheduler, make_tracing
from tickwheel.durable.store import Client, hide_secrets, shown_url

from ._handoff import DONE, DUPLICATE, FAILED, Dedup, HandoffConsumer, encode_message, message_id
from ._tasks import TaskRegistry

__all__ = ["NatsConsumer", "NatsPublisher"]

logger = logging.getLogger("tickwheel.durable")

# Seconds a publish may wait for its ack (and a connection for its server).
DEFAULT_TIMEOUT = 5.0


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: its reconnect loop reports each failed try."""
    logger.debug("nats: %r", exc)


def _refused(exc: BaseException) -> bool:
    """Is ``exc`` the server refusing the credentials (not being unreachable)?"""
    if isinstance(exc, (nats.errors.AuthorizationError, nats.errors.InvalidUserCredentialsError)):
        return True
    text = str(exc).lower()
    return "authorization violation" in text or "authentication" in text


async def _connect(url: str, wait: float) -> NatsClient:
    """A connection that reconnects on its own, for ever (the worker rides outages out).

    Raises:
        BrokerUnavailable: if no server answered.
        BrokerMisconfigured: if the server refused the credentials.
    """
    shown = shown_url(url)
    seen: list[Exception] = []  # what the first connect's tries reported
    refused = asyncio.Event()

    async def noted(exc: Exception) -> None:
        if len(seen) < 100:
            seen.append(exc)
        if _refused(exc):
            refused.set()
        await _quiet(exc)

    # Its reconnect loop would retry the first connect for ever, a refused password
    # included: bounded by ``wait``, and ended at the first refusal.
    connecting = asyncio.ensure_future(
        nats.connect(
            url,
            connect_timeout=wait,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.25,
            error_cb=noted,
        )
    )
    refusal = asyncio.ensure_future(refused.wait())
    await asyncio.wait({connecting, refusal}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    refusal.cancel()
    try:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await connecting
            raise TimeoutError
        nc = connecting.result()
    except (nats.errors.Error, OSError, TimeoutError) as exc:
        why = next((e for e in [exc, *seen] if _refused(e)), None)
        if why is not None:
            text = hide_secrets(str(why), url)
            raise BrokerMisconfigured(f"nats {shown}: credentials refused ({text})") from None
        raise BrokerUnavailable(hide_secrets(f"nats {shown} unavailable: {exc!r}", url)) from None
    seen.clear()  # later errors are the reconnect loop's: logged only
    return nc


class NatsPublisher:
    """Publish jobs to a JetStream stream; :meth:`publish` returns once acked.

    Args:
        url: ``nats://[user:password@]host:port``.
        subject: the subject (a stream must capture it: see :meth:`open`).
        timeout: seconds a publish waits for its ack before :class:`BrokerUnavailable`.
    """

    def __init__(self, url: str, subject: str, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not isinstance(subject, str) or not subject or " " in subject:
            raise ValueError(f"subject must be a NATS subject, got {subject!r}")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.url = url  # the server
        self.subject = subject  # where jobs go
        self.timeout = timeout  # seconds per ack
        self.stream: str | None = None  # the stream that captures subject (open() finds it)
        self.published = 0  # acks of new messages
        self.duplicates = 0  # acks with ``duplicate``: the stream had the message already
        self._nc: NatsClient | None = None
        self._js: nats.js.JetStreamContext | None = None

    async def open(self) -> None:
        """Connect and check that a stream captures the subject.

        Raises:
            BrokerUnavailable: if the server cannot be reached.
            BrokerMisconfigured: if no stream captures the subject, or the credentials
                are refused.
        """
        if self._js is not None:
            return
        nc = await _connect(self.url, self.timeout)
        js = nc.jetstream(timeout=self.timeout)
        try:
            self.stream = await js.find_stream_name_by_subject(self.subject)
        except nats.js.errors.NotFoundError:
            await nc.close()
            raise BrokerMisconfigured(
                f"nats {shown_url(self.url)}: no JetStream stream captures subject {self.subject!r}"
            ) from None
        except (nats.errors.Error, OSError) as exc:
            await nc.close()
            raise BrokerUnavailable(hide_secrets(f"nats unavailable: {exc!r}", self.url)) from None
        self._nc, self._js = nc, js

    async def publish(self, job: Job) -> None:
        """Publish ``job`` and wait for the stream's ack.

        Raises:
            BrokerUnavailable: no ack within the timeout, no stream answered, or the
                connection is closed (the message may be stored or not: the job is
                published again and the stream drops the copy within its window).
        """
        if self._js is None:
            await self.open()
        assert self._js is not None
        body, headers = encode_message(job)
        headers["Nats-Msg-Id"] = message_id(job.id, job.nominal_ms)
        try:
            ack = await self._js.publish(self.subject, body, timeout=self.timeout, headers=headers)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            raise BrokerUnavailable(f"nats publish of {job.id!r} not acked: {exc!r}") from None
        if ack.duplicate:
            self.duplicates += 1
        else:
            self.published += 1

    async def close(self) -> None:
        """Close the connection (waits for nothing: an unacked job keeps its lease)."""
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None:
            await nc.close()


class NatsConsumer(HandoffConsumer):
    """Run published jobs from a JetStream stream with a durable pull consumer.

    Each message's task runs with the :class:`TaskContext` a worker gives it. A message
    is acked once its task returned (or it was a duplicate), nak'ed (redelivered after
    ``retry_delay``) when the task raised, terminated when no retry mends it.

    Args:
        url: ``nats://[user:password@]host:port``.
        subject: the subject (filter) to read.
        durable: the durable consumer's name (consumers of one name share the work).
        registry: the tasks.
        dedup: a Redis for the dedup record shared by every consumer of ``durable``;
            None keeps it in this process (the last ``DEFAULT_DEDUP_KEEP`` occurrences).
        dedup_ttl: seconds an occurrence's owner is remembered in Redis.
        scheduler: given to each TaskContext (follow-up jobs).
        tracing: run each task in an OpenTelemetry ``CONSUMER`` span, the child of the
            message's ``traceparent`` (needs ``tickwheel[otel]``).
        batch: messages per fetch.
        ack_wait: seconds a delivered message may stay unacked before redelivery.
        retry_delay: seconds before a failed task's message is redelivered.
    """

    def __init__(
        self,
        url: str,
        subject: str,
        durable: str,
        registry: TaskRegistry,
        *,
        dedup: Client | None = None,
        dedup_ttl: float | timedelta = 3600.0,
        scheduler: Scheduler | None = None,
        tracing: bool = False,
        batch: int = 100,
        ack_wait: float = 30.0,
        retry_delay: float = 1.0,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        if type(batch) is not int or batch < 1:
            raise ValueError(f"batch must be a positive int, got {batch!r}")
        dedup_record = Dedup(dedup, f"tickwheel:nats:{subject}", durable, ttl=dedup_ttl)
        # Spans name the subject as their tickwheel.namespace.
        super().__init__(registry, dedup_record, scheduler, make_tracing(tracing, subject))
        self.url = url
        self.subject = subject
        self.durable = durable
        self.batch = batch
        self.ack_wait = ack_wait
        self.retry_delay = retry_delay
        self.timeout = timeout
        self._nc: NatsClient | None = None
        self._sub: Any = None  # the PullSubscription

    async def open(self) -> None:
        """Connect and bind (or create) the durable consumer.

        Raises:
            BrokerUnavailable: if the server cannot be reached.
            BrokerMisconfigured: if no stream captures the subject.
        """
        if self._sub is not None:
            return
        nc = await _connect(self.url, self.timeout)
        js = nc.jetstream(timeout=self.timeout)
        config = nats.js.api.ConsumerConfig(ack_wait=self.ack_wait)
        try:
            self._sub = await js.pull_subscribe(self.subject, durable=self.durable, config=config)
        except nats.js.errors.NotFoundError:
            await nc.close()
            raise BrokerMisconfigured(
                f"nats {shown_url(self.url)}: no JetStream stream captures subject {self.subject!r}"
            ) from None
        except nats.js.errors.BadRequestError as exc:  # e.g. the durable has another filter
            await nc.close()
            raise BrokerMisconfigured(
                f"nats {shown_url(self.url)}: consumer {self.durable!r} refused: {exc.description}"
            ) from None
        except (nats.errors.Error, OSError) as exc:
            await nc.close()
            raise BrokerUnavailable(hide_secrets(f"nats unavailable: {exc!r}", self.url)) from None
        self._nc = nc

    async def process(self, block: float | None = None) -> int:
        """Fetch up to ``batch`` messages (waiting up to ``block`` s for the first),
        run their tasks at once, and ack each; returns how many tasks ran.

        Raises:
            BrokerUnavailable: if the server cannot be reached.
            RedisUnavailable: if the dedup Redis cannot be reached (nothing acked).
        """
        if self._sub is None:
            await self.open()
        try:
            msgs: list[Msg] = await self._sub.fetch(self.batch, timeout=block or 0.05)
        except nats.errors.TimeoutError:
            return 0
        except (nats.errors.Error, OSError) as exc:
            raise BrokerUnavailable(f"nats fetch failed: {exc!r}") from None
        return await self._settle(msgs)

    async def _settle(self, msgs: list[Msg]) -> int:
        outcomes = await asyncio.gather(*(self._consume(m.data, m.headers) for m in msgs))
        ran = 0
        try:
            for msg, outcome in zip(msgs, outcomes, strict=True):
                if outcome in (DONE, DUPLICATE):
                    await msg.ack()
                    ran += outcome == DONE
                elif outcome == FAILED:
                    await msg.nak(delay=self.retry_delay)
                else:
                    await msg.term()
        except (nats.errors.Error, OSError) as exc:
            # Not acked: redelivered after ack_wait, and the dedup lets the owner run again
            raise BrokerUnavailable(f"nats ack failed: {exc!r}") from None
        return ran

    async def close(self) -> None:
        """Close the connection (unacked messages are redelivered after ``ack_wait``)."""
        nc, self._nc, self._sub = self._nc, None, None
        if nc is not None:
            await nc.close()
