"""No credential of a URL is ever shown: ``store.shown_url`` over a table of URL shapes,
``hide_secrets`` over driver messages, and the errors of ``connect`` for malformed URLs
(issue 42, finding 2)."""

from __future__ import annotations

import asyncio
import traceback

import pytest

from tickwheel.durable.store import client_from_url, connect, hide_secrets, shown_url

SECRET = "Hunter2xyz"

# (the URL, what it shows). Every one of them holds SECRET somewhere, or a piece of it.
SHAPES = [
    # userinfo
    (f"redis://:{SECRET}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
    (f"redis://alice:{SECRET}@host:6379/0", "redis://alice:***@host:6379/0"),
    (f"rediss://alice:{SECRET}@host:6380/1", "rediss://alice:***@host:6380/1"),
    (f"redis://{SECRET}@host:6379", "redis://***@host:6379"),
    (f"unix://:{SECRET}@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    (f"redis+cluster://:{SECRET}@a:1,b:2", "redis+cluster://:***@a:1,b:2"),
    (f"postgresql://tw:{SECRET}@db:5432/tw", "postgresql://tw:***@db:5432/tw"),
    (f"amqp://guest:{SECRET}@mq:5672/vhost", "amqp://guest:***@mq:5672/vhost"),
    (f"nats://tok:{SECRET}@nats:4222", "nats://tok:***@nats:4222"),
    (f"alice:{SECRET}@host:6379", "alice:***@host:6379"),  # no scheme
    # query parameters, any case, encoded or not
    (f"unix:///run/redis.sock?password={SECRET}", "unix:///run/redis.sock?password=***"),
    (f"redis://h:1/0?db=2&PASSWORD={SECRET}", "redis://h:1/0?db=2&PASSWORD=***"),
    (f"redis://h:1/0?username={SECRET}&db=2", "redis://h:1/0?username=***&db=2"),
    (f"postgresql://db/tw?user=tw&password={SECRET}", "postgresql://db/tw?user=***&password=***"),
    (f"postgresql://db/tw?sslpassword={SECRET}", "postgresql://db/tw?sslpassword=***"),
    (f"nats://nats:4222?token={SECRET}", "nats://nats:4222?token=***"),
    (f"amqp://mq/?auth={SECRET}", "amqp://mq/?auth=***"),
    (f"redis://h/0?pass={SECRET}", "redis://h/0?pass=***"),
    (f"redis://h/0?pass%77ord={SECRET}", "redis://h/0?pass%77ord=***"),
    (f"redis://h/0?password={SECRET}#frag", "redis://h/0?password=***"),
    (f"redis://h/0?password=Hunt&{SECRET}", "redis://h/0?password=***&***"),
    # malformed: an unencoded delimiter in the password
    (f"redis://:pa#{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
    (f"redis://:pa?{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
    (f"redis://:pa/{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
    (f"redis://:pa@{SECRET}@host:6379/0", "redis://:***@host:6379/0"),
    (f"redis://u/x:{SECRET}@host:6379/0", "redis://***@host:6379/0"),
    (f"postgresql://tw:a#b/{SECRET}@db/tw", "postgresql://tw:***@db/tw"),
    (f"redis://host:6379/0?password=a@{SECRET}", "redis://***"),
    ("redis://host:6379/0?client_name=a@b.c", "redis://host:***@b.c"),
]


@pytest.mark.parametrize(("url", "shown"), SHAPES, ids=[s for s, _ in SHAPES])
def test_shown_url_shows_no_credential(url: str, shown: str) -> None:
    got = shown_url(url)
    assert "Hunter" not in got and SECRET not in got
    assert got == shown


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379/0", "unix:///run/redis.sock?db=2", "redis+cluster://a:1,b:2"],
)
def test_shown_url_leaves_a_url_without_credentials_as_it_is(url: str) -> None:
    assert shown_url(url) == url


def test_shown_url_of_what_is_not_a_str() -> None:
    assert shown_url(b"redis://:pw@h") == "<bytes>"  # type: ignore[arg-type]


@pytest.mark.parametrize(("url", "_"), SHAPES, ids=[s for s, _ in SHAPES])
def test_hide_secrets_cleans_a_message_quoting_the_url(url: str, _: str) -> None:
    message = f"Error connecting to {url}: refused (was {url!r})"
    assert "Hunter" not in hide_secrets(message, url)


def test_hide_secrets_cleans_a_url_it_was_not_given() -> None:
    assert SECRET not in hide_secrets(f"failed: redis://:{SECRET}@h:1/0 down")


MALFORMED = [
    f"redis://:se/{SECRET}@127.0.0.1:1/0",
    f"redis://:se#{SECRET}@127.0.0.1:1/0",
    f"redis://:sec?{SECRET}@127.0.0.1:1/0",
    f"redis://:{SECRET}@127.0.0.1:notaport/0",
    f"redis+cluster://:se/{SECRET}@127.0.0.1:1",
    f"redis://127.0.0.1:1/0?password={SECRET}&socket_timeout=x",
    f"unix://:{SECRET}@/nonexistent/tw.sock",
]


@pytest.mark.parametrize("url", MALFORMED)
def test_connect_errors_show_no_piece_of_the_password(url: str) -> None:
    async def attempt() -> str:
        try:
            client = client_from_url(url)
            await client.aclose()
            await connect(url)
        except Exception as exc:
            return "".join(traceback.format_exception(exc))
        return "no error"

    message = asyncio.run(attempt())
    assert message != "no error"
    for piece in ("Hunter", "se'", "'se", "sec'", "'sec"):
        assert piece not in message, message
