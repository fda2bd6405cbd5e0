"""Load the Lua scripts (package data) and register them on a redis-py client.

Each script is ``lua/_lib.lua`` followed by ``lua/<name>.lua``: Redis Lua has no include,
so the shared helpers are prepended here, once. Registration goes through
``redis.asyncio.Redis.register_script``, whose ``AsyncScript`` sends EVALSHA and falls
back to SCRIPT LOAD on NOSCRIPT (after a SCRIPT FLUSH or a failover to a fresh replica);
in a pipeline, redis-py loads missing scripts before executing.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from ._connect import Client

__all__ = ["SCRIPT_NAMES", "STANDALONE_SCRIPTS", "Scripts", "register", "source"]

# One script per atomic transition; each file opens with its KEYS/ARGV/return header.
SCRIPT_NAMES = (
    "init",
    "now",
    "schedule",
    "schedule_one",
    "cancel",
    "reschedule",
    "get",
    "claim",
    "ack",
    "retry",
    "extend",
    "release",
    "reap",
    "dead_list",
    "due_list",
    "due_rank",
    "dead_requeue",
    "dead_purge",
    "inspect",
    "take",
    "renew",
    "give_back",
    "raise_epoch",
    "members",
)
# Scripts that run without the helpers of _lib.lua: a stream consumer's occurrence claim,
# registered on the stream's own client (runtime/_stream.py), not on a Store's.
STANDALONE_SCRIPTS = ("dedup",)


@functools.cache
def source(name: str) -> str:
    """Return the full Lua source of script ``name`` (helpers included where it uses them).

    Raises:
        ValueError: if ``name`` is not one of :data:`SCRIPT_NAMES` or
            :data:`STANDALONE_SCRIPTS`.
    """
    if name not in SCRIPT_NAMES and name not in STANDALONE_SCRIPTS:
        raise ValueError(f"name must be one of {SCRIPT_NAMES + STANDALONE_SCRIPTS}, got {name!r}")
    folder = resources.files(__package__).joinpath("lua")
    body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    if name in STANDALONE_SCRIPTS:
        return body
    lib = folder.joinpath("_lib.lua").read_text(encoding="utf-8")
    return f"{lib}\n{body}"


def register(client: Client, name: str) -> AsyncScript:
    """Register script ``name`` on ``client`` (EVALSHA, with SCRIPT LOAD on NOSCRIPT)."""
    return client.register_script(source(name))


class Scripts:
    """The scripts, registered on one client (attribute per script)."""

    __slots__ = SCRIPT_NAMES

    init: AsyncScript
    now: AsyncScript
    schedule: AsyncScript
    schedule_one: AsyncScript
    cancel: AsyncScript
    reschedule: AsyncScript
    get: AsyncScript
    claim: AsyncScript
    ack: AsyncScript
    retry: AsyncScript
    extend: AsyncScript
    release: AsyncScript
    reap: AsyncScript
    dead_list: AsyncScript
    due_list: AsyncScript
    due_rank: AsyncScript
    dead_requeue: AsyncScript
    dead_purge: AsyncScript
    inspect: AsyncScript
    take: AsyncScript
    renew: AsyncScript
    give_back: AsyncScript
    raise_epoch: AsyncScript
    members: AsyncScript

    def __init__(self, client: Client) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, register(client, name))
