"""Load the Lua scripts (package data) and register them on a redis-py client.

Each script is the helpers of ``lua/_lib.lua`` that it uses followed by
``lua/<name>.lua``: Redis Lua has no include, so the shared helpers are prepended here,
once. Registration goes through
``redis.asyncio.Redis.register_script``, whose ``AsyncScript`` sends EVALSHA and falls
back to SCRIPT LOAD on NOSCRIPT (after a SCRIPT FLUSH or a failover to a fresh replica);
in a pipeline, redis-py loads missing scripts before executing.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.commands.core import AsyncScript

    from ._connect import Client
    from ._keys import Keys
    from ._transport import Transport

__all__ = ["SCRIPT_NAMES", "STANDALONE_SCRIPTS", "ScriptCalls", "Scripts", "register", "source"]

# One script per atomic transition; each file opens with its KEYS/ARGV/return header.
SCRIPT_NAMES = (
    "init",
    "now",
    "schedule",
    "schedule_one",
    "flow",
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
    "pause",
    "pause_state",
    "limits",
    "wake",
    "waits",
    "woken",
)
# Scripts that run without the helpers of _lib.lua: a stream consumer's occurrence claim,
# registered on the stream's own client (store/_streams.py), not on a Store's.
STANDALONE_SCRIPTS = ("dedup",)


# A top-level definition of lua/_lib.lua: "local function name(" up to its "end" at the
# line's start, or "local a, b = ..." on one line.
_TOP = re.compile(r"local (?:function (\w+)\(|([\w, ]+?) = )")
_WORD = re.compile(r"[A-Za-z_]\w*")


@functools.cache
def _lib_blocks() -> tuple[tuple[frozenset[str], str], ...]:
    """The top-level definitions of lua/_lib.lua in order: the names each defines, and its
    text (comments between them dropped).

    Raises:
        ValueError: on a top-level line that is none of those, a comment or blank.
    """
    text = resources.files(__package__).joinpath("lua/_lib.lua").read_text(encoding="utf-8")
    lines = text.splitlines()
    blocks: list[tuple[frozenset[str], str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _TOP.match(line)
        if match is None:
            if line.strip() and not line.startswith("--"):
                raise ValueError(f"_lib.lua line {i + 1} is not a definition: {line!r}")
            i += 1
            continue
        if match[1]:
            end = lines.index("end", i)
            names = frozenset({match[1]})
        else:
            end = i
            names = frozenset(n.strip() for n in match[2].split(","))
        blocks.append((names, "\n".join(lines[i : end + 1])))
        i = end + 1
    return tuple(blocks)


def _helpers_for(body: str) -> str:
    """The definitions of lua/_lib.lua that ``body`` uses, directly or through another
    one, in their order there. Every script call runs the helpers it is sent with (a
    script cannot keep functions between calls), so sending only these saves the
    cost of defining the rest each time (measured by callgrind, whole redis-server:
    59k instructions a call for now.lua with all of them)."""
    blocks = _lib_blocks()
    wanted: set[str] = set()
    todo = [body]
    while todo:
        words = set(_WORD.findall(todo.pop()))
        for names, text in blocks:
            if names & words and not names <= wanted:
                wanted |= names
                todo.append(text)
    return "\n".join(text for names, text in blocks if names & wanted)


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
    return f"{_helpers_for(body)}\n{body}"


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
    flow: AsyncScript
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
    pause: AsyncScript
    limits: AsyncScript
    wake: AsyncScript
    waits: AsyncScript
    woken: AsyncScript
    pause_state: AsyncScript

    def __init__(self, client: Client) -> None:
        for name in SCRIPT_NAMES:
            setattr(self, name, register(client, name))


class ScriptCalls:
    """The base of a room of script calls over one namespace (pauses, reaping, fencing,
    flow limits, the operator's calls): what each of them sends through.

    Args:
        transport: the store's transport.
        scripts: the store's registered scripts.
        keys: the namespace's key names.
    """

    __slots__ = ("_scripts", "keys", "transport")

    def __init__(self, transport: Transport, scripts: Scripts, keys: Keys) -> None:
        self.transport = transport
        self._scripts = scripts
        self.keys = keys
