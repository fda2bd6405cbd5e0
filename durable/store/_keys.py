"""Redis key names of a namespace: every key is built here and nowhere else.

Ground rules:

- Every key of shard ``s`` carries the hash tag ``{ns:s}``, so each Lua script touches
  one hash slot (no CROSSSLOT on Redis Cluster) while shards spread over the nodes.
- A job id maps to its shard by CRC-32 of its UTF-8 bytes modulo the shard count: stable
  across processes and Python versions (unlike ``hash()``), so every client agrees.
- Within a shard, job records are spread over ``buckets`` small hashes
  ``{ns:s}:jobs:<b>``, ``b`` = the first 32 bits of SHA-1(id) mod ``buckets`` (the
  scripts compute the same with ``redis.sha1hex``). Redis stores a hash of at most 128
  short entries as a listpack, at about half the memory of a hashtable entry.
- The shard and bucket counts are part of the mapping. They are stored under
  :attr:`Keys.meta` on first use and a mismatch is refused (see ``init.lua``), since
  changing either strands jobs.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import NamedTuple

from tickwheel.durable.model import MAX_JOB_ID_BYTES, int_between

__all__ = [
    "DEFAULT_BUCKETS",
    "MAX_BUCKETS",
    "MAX_JOB_ID_BYTES",
    "MAX_NAMESPACE_BYTES",
    "MAX_SHARDS",
    "Keys",
    "ShardKeys",
    "parse_layout",
]

# Namespaces are repeated in every key name, so a short cap keeps key names small.
MAX_NAMESPACE_BYTES = 64
# More shards than Redis Cluster has slots cannot spread any further.
MAX_SHARDS = 16384
# Record hashes per shard. Redis keeps a hash listpack-encoded up to 512 entries by
# default (hash-max-listpack-entries; 128 is the sorted-set default): 64 buckets keep a
# shard listpacked up to ~32k pending jobs (10^5 jobs over 16 shards is ~100 per bucket),
# measured at 179 instead of 235 bytes per pending job (bench: durable memory). Past
# that, buckets turn into hashtables one by one and cost what one big hash would. Every
# lookup in a listpack scans it: at 156 entries a bucket, a claimed and acked job cost
# Redis 141k instructions against 134k with hashtables (callgrind). Claims pass every
# bucket key, so keep it modest.
DEFAULT_BUCKETS = 64
MAX_BUCKETS = 1024
# Flow keys whose limit key names a Keys keeps made (limit_keys), at most.
LIMIT_KEYS_KEPT = 10_000


class ShardKeys(NamedTuple):
    """The keys of one shard, all tagged ``{ns:s}``."""

    due: str  # ZSET job id -> due time (ms): the scheduled state, due within ~2 minutes
    leased: str  # ZSET job id -> lease deadline (ms): the leased state
    jobs: tuple[str, ...]  # HASHes job id -> packed job record (lua/_lib.lua), by bucket
    done: str  # ZSET "nominal:id" -> completion time (ms): dedup of finished occurrences
    dead: str  # ZSET job id -> time of death (ms): dead letters (record kept in jobs)
    epoch: str  # STRING fencing epoch of the shard's owner, INCR'd on every takeover
    owner: str  # STRING owner token, with a TTL
    clock: str  # STRING high-water mark of the shard's clock (ms)
    far: str  # ZSET chunk of ids -> slot start (ms): the scheduled state, due later
    faro: str  # HASH slot start -> the open chunk of ids of the far index's slot
    # Pause (scheduler/_pause.py): the shard's copy of Keys.paused, which claim.lua reads,
    # and the parked jobs, the due jobs of paused tasks that a claim met (still scheduled)
    paused: str  # HASH task (or "": the whole namespace) -> time paused (ms)
    parked: str  # ZSET job id -> due time (ms)
    parkedx: str  # ZSET (all scores 0) "<task>\0<due, 16 digits>\0<id>": by task, due order
    # Flow limits (store/_limits.py): jobs waiting for a permit of their key, and wakes
    waiting: str  # HASH task -> its jobs waiting (record field 18), '' -> those out of due
    rechecks: str  # ZSET "<task>\0<key>" -> when: a flow key's recheck (a lost wake's net)
    wakes: str  # ZSET job id -> until (ms): a permit handed to it while still leased
    # ZSET job id -> (9 - priority) * 2**49 + due (ms): the due jobs with a priority above
    # 0, by level then due (lua/_lib.lua: prio_lanes); a hint the claim checks against due
    prio: str
    trail: str  # HASH job id -> its pending trailing run (flow.lua; ack.lua creates it)


class Keys:
    """Key names of one namespace with a fixed shard count.

    Args:
        namespace: the namespace, 1 to ``MAX_NAMESPACE_BYTES`` UTF-8 bytes, without
            ``{`` or ``}`` (they would break the hash tag).
        shards: the number of shards, 1 to ``MAX_SHARDS``.
        buckets: record hashes per shard, 1 to ``MAX_BUCKETS``.

    Raises:
        TypeError: if ``namespace`` is not a str, ``shards`` or ``buckets`` not an int.
        ValueError: if one is out of range.
    """

    __slots__ = (
        "_limit_keys",
        "_shards",
        "buckets",
        "cancels",
        "limits",
        "meta",
        "mode",
        "namespace",
        "paused",
        "samples",
        "shards",
        "workers",
    )

    def __init__(self, namespace: str, shards: int, buckets: int = DEFAULT_BUCKETS) -> None:
        if not isinstance(namespace, str):
            raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
        size = len(namespace.encode())
        if not 0 < size <= MAX_NAMESPACE_BYTES:
            raise ValueError(
                f"namespace must be 1 to {MAX_NAMESPACE_BYTES} UTF-8 bytes, got {size}"
            )
        if "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace must not contain '{{' or '}}', got {namespace!r}")
        int_between("shards", shards, 1, MAX_SHARDS)
        int_between("buckets", buckets, 1, MAX_BUCKETS)
        self.namespace = namespace  # the namespace, as given
        # limit_keys' names by (task, key), made once (a SHA-1 and five formats each);
        # emptied at LIMIT_KEYS_KEPT entries.
        self._limit_keys: dict[tuple[str, str], tuple[str, str, str, str, str]] = {}
        self.shards = shards  # shard count N
        self.buckets = buckets  # record hashes per shard
        self.meta = f"{{{namespace}}}:meta"  # STRING "shards:buckets", set on first use
        # STRING "postgres" once a Postgres-mode scheduler opened the namespace (init.lua):
        # anything without postgres_url is refused on it (PostgresModeRequired).
        self.mode = f"{{{namespace}}}:mode"
        self.workers = f"{{{namespace}}}:workers"  # ZSET worker token -> last heartbeat (ms)
        # STREAM of the workers' chart samples (their counters' change every few seconds,
        # store/_workers.py), trimmed to the last hour by id: what the charts show.
        self.samples = f"{{{namespace}}}:samples"
        # Pub/sub channel: cancel.lua publishes the id of a leased job it removed, and
        # each worker listens, to stop that job's handler if it runs there.
        self.cancels = f"{{{namespace}}}:cancels"
        # HASH task (or "": the whole namespace) -> time paused (ms): the pause state
        # of record; every shard has a copy (ShardKeys.paused), for its claims.
        self.paused = f"{{{namespace}}}:paused"
        # HASH task -> its flow limits (model/_limits.py's stored form), written by the
        # workers that register the task (store/_limits.py, docs/limits.md).
        self.limits = f"{{{namespace}}}:limits"
        self._shards = tuple(self._build(s) for s in range(shards))  # ShardKeys by shard

    def _build(self, shard: int) -> ShardKeys:
        tag = f"{{{self.namespace}:{shard}}}"
        return ShardKeys(
            due=f"{tag}:due",
            leased=f"{tag}:leased",
            jobs=tuple(f"{tag}:jobs:{b}" for b in range(self.buckets)),
            done=f"{tag}:done",
            dead=f"{tag}:dead",
            epoch=f"{tag}:epoch",
            owner=f"{tag}:owner",
            clock=f"{tag}:clock",
            far=f"{tag}:far",
            faro=f"{tag}:faro",
            paused=f"{tag}:paused",
            parked=f"{tag}:parked",
            parkedx=f"{tag}:parkedx",
            waiting=f"{tag}:kwaitn",
            rechecks=f"{tag}:krecheck",
            wakes=f"{tag}:kwake",
            prio=f"{tag}:prio",
            trail=f"{tag}:trail",
        )

    def shard_of(self, job_id: str) -> int:
        """Return the shard of a job id (CRC-32 of its UTF-8 bytes mod N). O(len(id))."""
        return zlib.crc32(job_id.encode()) % self.shards

    def bucket_of(self, job_id: str) -> int:
        """Return the record bucket of a job id within its shard. O(len(id)).

        The first 32 bits of SHA-1, as ``bucket_index`` in lua/_lib.lua computes them.
        """
        return int(hashlib.sha1(job_id.encode()).hexdigest()[:8], 16) % self.buckets

    def jobs_key(self, shard: int, job_id: str) -> str:
        """Return the record hash of ``job_id`` in ``shard``."""
        return self.shard(shard).jobs[self.bucket_of(job_id)]

    def flow_key(self, shard: int, kind: str, job_id: str) -> str:
        """Return the debounce (``kind`` "d": ``{ns:s}:deb:<id>``) or throttle ("t":
        ``{ns:s}:thr:<id>``) STRING of ``job_id`` (flow.lua; a TTL bounds it)."""
        return f"{{{self.namespace}:{shard}}}:{'deb' if kind == 'd' else 'thr'}:{job_id}"

    def history(self, shard: int) -> str:
        """Return the STREAM of shard ``shard``'s finished attempts (``{ns:s}:history``,
        capped; written by the workers, read by the dashboard: store/_history.py)."""
        return f"{{{self.namespace}:{shard}}}:history"

    def limit_keys(self, task: str, key: str) -> tuple[str, str, str, str, str]:
        """Return the keys of the permits of ``key`` (``""``: the task's single key) of
        ``task`` (limits.lua): permits, holders, waiters, starts, booked. All carry the
        tag ``{ns:L:<hash>}``, the first 32 bits of SHA-1 of the task and key in hex, so
        one key's permits are in one slot whatever shards its jobs are in; the names
        hold the task and key themselves, so two keys never share them."""
        got = self._limit_keys.get((task, key))
        if got is not None:
            return got
        name = f"{len(task)}:{task}:{key}"
        digest = hashlib.sha1(name.encode(errors="surrogatepass")).hexdigest()[:8]
        tag = f"{{{self.namespace}:L:{digest}}}"
        got = (
            f"{tag}:p:{name}",
            f"{tag}:h:{name}",
            f"{tag}:q:{name}",  # a LIST (it was a ZSET named :w:)
            f"{tag}:s:{name}",
            f"{tag}:b:{name}",
        )
        if len(self._limit_keys) >= LIMIT_KEYS_KEPT:
            self._limit_keys.clear()
        self._limit_keys[(task, key)] = got
        return got

    def worker_stats(self, token: str) -> str:
        """Return the STRING where the worker ``token`` publishes its counters
        (``{ns}:wstats:<token>``, JSON with a TTL; same slot as :attr:`workers`)."""
        return f"{{{self.namespace}}}:wstats:{token}"

    def claim_reply(self, shard: int, token: str) -> str:
        """Return the STRING where claim.lua keeps the reply of the claim ``token``
        (``{ns:s}:claim:<token>``, with a TTL), so a re-sent claim returns it again."""
        return f"{self.shard(shard).due[:-4]}:claim:{token}"

    def shard(self, shard: int) -> ShardKeys:
        """Return the keys of shard ``shard``.

        Raises:
            ValueError: if ``shard`` is not in ``range(self.shards)``.
        """
        if not isinstance(shard, int) or not 0 <= shard < self.shards:
            raise ValueError(f"shard must be in range({self.shards}), got {shard!r}")
        return self._shards[shard]


def parse_layout(stored: bytes) -> tuple[int, int]:
    """The ``(shards, buckets)`` of a meta key's ``shards:buckets`` (buckets 0 if absent).

    Raises:
        ValueError: if the value is not two counts.
    """
    shards, _, buckets = stored.decode(errors="replace").partition(":")
    return int(shards), int(buckets or 0)
