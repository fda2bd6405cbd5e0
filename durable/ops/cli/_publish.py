"""``tickwheel worker --publish URL``: the publish handoff's broker, chosen by the URL's
scheme (``nats://``, ``amqp://``/``amqps://``, ``redis://``/``rediss://``), with the
option each broker needs (``--subject``, ``--exchange``, ``--stream``)."""

from __future__ import annotations

import argparse
import urllib.parse
from typing import Any

from tickwheel.durable.model import BrokerMisconfigured, BrokerUnavailable
from tickwheel.durable.runtime import Publisher, StreamPublisher
from tickwheel.durable.store import connect

from ._common import EXIT_UNREACHABLE, EXIT_USAGE, CliError, hide_password

__all__ = ["add_publish_options", "open_publisher"]


def add_publish_options(work: argparse.ArgumentParser) -> None:
    """The worker's handoff options."""
    work.add_argument(
        "--publish",
        metavar="URL",
        help="publish due jobs to a broker instead of running tasks: nats://HOST:PORT"
        " (with --subject; tickwheel[nats]), amqp://USER:PASS@HOST:PORT/VHOST (with"
        " --exchange; tickwheel[rabbitmq]) or redis://... (with --stream)",
    )
    work.add_argument("--subject", help="--publish nats://: the JetStream subject")
    work.add_argument("--exchange", help="--publish amqp://: the exchange")
    work.add_argument(
        "--routing-key", help="--publish amqp://: the routing key (default: the task name)"
    )
    work.add_argument("--stream", help="--publish redis://: the stream key")


def _need(args: argparse.Namespace, option: str, scheme: str) -> str:
    value: str | None = getattr(args, option.replace("-", "_"))
    if value is None:
        raise CliError(EXIT_USAGE, f"--publish {scheme}:// needs --{option}")
    return value


async def open_publisher(args: argparse.Namespace) -> tuple[Publisher | None, Any]:
    """The publisher ``--publish`` asks for, opened (a misconfiguration or an
    unreachable broker fails the start), and what closes it; (None, None) without
    ``--publish``.

    Raises:
        CliError: usage (a bad URL, a missing option or extra, a misconfigured
            broker) or unreachable.
    """
    url: str | None = args.publish
    if url is None:
        for option in ("subject", "exchange", "routing_key", "stream"):
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise CliError(EXIT_USAGE, f"{flag} needs --publish")
        return None, None
    scheme = urllib.parse.urlsplit(url).scheme
    publisher: Any
    try:
        if scheme == "nats":
            from tickwheel.durable.runtime.jetstream import NatsPublisher  # noqa: PLC0415

            publisher = NatsPublisher(url, _need(args, "subject", scheme))
        elif scheme in ("amqp", "amqps"):
            from tickwheel.durable.runtime.amqp import RabbitPublisher  # noqa: PLC0415

            publisher = RabbitPublisher(
                url, _need(args, "exchange", scheme), routing_key=args.routing_key
            )
        elif scheme in ("redis", "rediss"):
            client = await connect(url)
            stream = StreamPublisher(client, _need(args, "stream", scheme))
            return stream, client.aclose
        else:
            raise CliError(EXIT_USAGE, f"--publish: unknown scheme {scheme!r} (nats, amqp, redis)")
        await publisher.open()
    except ImportError as exc:
        raise CliError(EXIT_USAGE, f"--publish {scheme}://: {exc} (install the extra)") from None
    except (BrokerMisconfigured, ValueError) as exc:
        raise CliError(EXIT_USAGE, f"--publish: {hide_password(url, exc)}") from None
    except BrokerUnavailable as exc:
        raise CliError(EXIT_UNREACHABLE, f"--publish: {hide_password(url, exc)}") from None
    return publisher, publisher.close
