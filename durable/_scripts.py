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

__all__ = ["SCRIPT_NAMES", "Scripts", "source"]

# One script per atomic transition; each file opens with its KEYS/ARGV/return header.
SCRIPT_NAMES = (
    "init",
    "now",
    "schedule",
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
    "dead_requeue",
    "dead_purge",
    "inspect",
    "take",
    "renew",
    "give_back",
    "raise_epoch",
)


@functools.cache
def source(name: str) -> str:
    """Return the full Lua source of script ``name`` (helpers included).

    Raises:
        ValueError: if ``name`` is not one of :data:`SCRIPT_NAMES`.
    """
    if name not in SCRIPT_NAMES:
        raise ValueError(f"name must be one of {SCRIPT_NAMES}, got {name!r}")
    folder = resources.files(__package__).joinpath("lua")
    lib = folder.joinpath("_lib.lua").read_text(encoding="utf-8")
    body = folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return f"{lib}\n{body}"


class Scripts:
    """The scripts, registered on one client (attribute per script)."""

    __slots__ = SCRIPT_NAMES

    init: AsyncScript
    now: AsyncScript
    schedule: AsyncScript
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
    dead_requeue: AsyncScript
    dead_purge: AsyncScript
    inspect: AsyncScript
    take: AsyncScript
    renew: AsyncScript
    give_back: AsyncScript
    raise_epoch: AsyncScript

    def __init__(self, client: Client) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, client.register_script(source(name)))
