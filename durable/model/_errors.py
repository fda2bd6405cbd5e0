"""Errors of tickwheel.durable (store/_errors.py translates Redis's into these).

Each class says whether it is *transient* (retrying the same call later may succeed) or
*permanent* (it will not, until the caller changes something). Bad arguments raise the
built-in ``TypeError``/``ValueError`` naming the parameter, never these.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BrokerMisconfigured",
    "BrokerUnavailable",
    "DurableError",
    "Fenced",
    "LeaseLost",
    "ListingTooLong",
    "NotOwner",
    "PostgresModeRequired",
    "PostgresUnavailable",
    "RedisConfigError",
    "RedisUnavailable",
    "ReplicationTimeout",
    "SchemaNotReady",
    "ServerCheckFailed",
    "ShardCountMismatch",
]


class DurableError(Exception):
    """Base class of the errors a caller of tickwheel.durable acts on."""

    transient: ClassVar[bool] = False  # True: the same call may succeed later


class RedisUnavailable(DurableError):
    """Redis could not be reached, timed out, or refused for now (out of memory,
    loading its data, busy with a script, too few replicas). Transient: retry later.

    The operation was one script (or one MULTI/EXEC), so it was applied whole or not at
    all; scheduling is idempotent, so a retry cannot double a job.
    """

    transient = True


class RedisConfigError(DurableError):
    """Redis answered, and refused the connection's configuration: wrong credentials
    (``WRONGPASS``, ``NOAUTH``: a password is needed, or the URL's is wrong), a user
    without the permission for a command (``NOPERM``), or a database index the server
    does not have (``DB index is out of range``). Permanent: retrying the same URL
    fails the same way until the URL (or the server's ACL) is changed.

    A port where nothing listens is not one of these: the server may be starting, so
    it stays :class:`RedisUnavailable` (its message names the host and port).
    """


class PostgresModeRequired(DurableError):
    """The namespace is in the Postgres mode (a scheduler with ``postgres_url`` first
    opened it), and the caller has no ``postgres_url``. Permanent: pass the same
    ``postgres_url`` (``--postgres-url`` on the command line). Nothing was written.

    Without it a job would be written to Redis only, and a Postgres-mode worker would
    find no row for it and drop it unrun; a worker without it would run jobs whose
    completion PostgreSQL never learns.
    """

    def __init__(self, namespace: str, detail: str = "") -> None:
        super().__init__(
            f"namespace {namespace!r} is in the Postgres mode: pass postgres_url "
            "(--postgres-url on the command line) with the namespace's PostgreSQL URL"
            + (f"; {detail}" if detail else "")
        )
        self.namespace = namespace


class ReplicationTimeout(DurableError):
    """Fewer replicas than asked confirmed a write within the timeout. Transient.

    The write *was* applied on the master; it may be lost if the master dies before a
    replica copies it. Retrying the same call is safe (scheduling is idempotent) and
    waits again.
    """

    transient = True

    def __init__(self, message: str, acked: int, wanted: int) -> None:
        super().__init__(message)
        self.acked = acked  # replicas that confirmed (WAIT's reply)
        self.wanted = wanted  # replicas asked for


class Fenced(DurableError):
    """The caller's shard epoch is stale: another owner took the shard. Permanent.

    The owner must drop the shard (and its leases) and may try to take it again.
    """

    def __init__(self, message: str, shard: int | None = None) -> None:
        super().__init__(message)
        self.shard = shard  # the shard the caller was fenced out of, when known


class LeaseLost(DurableError):
    """The lease of this (job, epoch, attempt) is gone. Permanent for this attempt.

    The lease expired and was reaped, the job was cancelled, or a later attempt holds it:
    the caller's result must not be recorded.
    """


class ListingTooLong(DurableError):
    """A listing of a shard's scheduled jobs in due order (the dashboard's page,
    ``Store.due_list``, ``Store.due_rank``) would read more than 50,000 entries of its
    far index, which it reads from the start. Permanent for that page: ask for an
    earlier one."""


class NotOwner(DurableError):
    """The caller does not own the shard it tried to act on. Permanent until taken."""


class ShardCountMismatch(DurableError):
    """The namespace was created with another shard (or bucket) count. Permanent.

    Changing either would map ids to other keys and strand every pending job.
    """

    def __init__(self, namespace: str, stored: tuple[int, int], given: tuple[int, int]) -> None:
        super().__init__(
            f"namespace {namespace!r} was created with shards={stored[0]}, "
            f"buckets={stored[1]}; got shards={given[0]}, buckets={given[1]}"
        )
        self.stored = stored  # (shards, buckets) stored in Redis
        self.given = given  # (shards, buckets) the caller passed


class PostgresUnavailable(DurableError):
    """PostgreSQL could not be reached, timed out, or failed the transaction for now
    (a restart, a serialization failure, too many connections). Transient: retry later.

    The call's transaction was rolled back: nothing of it is in PostgreSQL, and nothing
    was written to Redis (the Redis side follows a commit, never precedes it).
    """

    transient = True


class SchemaNotReady(DurableError):
    """The PostgreSQL database lacks tickwheel's tables, or has an older version of
    them. Permanent until ``tickwheel pg migrate`` is run (nothing runs DDL on its own).
    """

    def __init__(self, message: str, found: int, wanted: int) -> None:
        super().__init__(message)
        self.found = found  # the schema version in the database (0: none)
        self.wanted = wanted  # the version this library needs


class ServerCheckFailed(DurableError):
    """The Redis server is unfit for durable jobs (strict mode). Permanent."""


class BrokerUnavailable(DurableError):
    """A message broker of the publish handoff (NATS JetStream, RabbitMQ) could not be
    reached, timed out, or did not confirm a publish (a nack, a message it could not
    route, a connection lost before the confirm). Transient: retry later.

    The message may or may not be stored: the job's lease is left to the reaper, the job
    is published again, and the broker's dedup or the consumer drops the second copy.
    """

    transient = True


class BrokerMisconfigured(DurableError):
    """The broker refused the handoff's setup: no stream for the subject, no such
    exchange or queue, bad credentials or no permission. Permanent until the broker or
    the arguments are changed; raised at start (``open()``)."""
