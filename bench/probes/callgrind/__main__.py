"""``python -m bench.probes.callgrind KIND [options]``: one of the callgrind probes.

Each kind is a module of this package with ``add_arguments(parser)`` and ``run(args)``;
only the chosen one is imported (``durable-redis --durable-dir`` must load another
checkout's ``tickwheel.durable`` before anything imports this one's).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bench.probes.callgrind._tools import missing

KINDS = {
    "wheel": ("wheel", "instructions per wheel or loop operation (client process)"),
    "server": ("server", "instructions per request of the server scenario's servers"),
    "durable-client": ("durable_client", "client instructions per job of the hot paths"),
    "durable-redis": ("durable_redis", "redis-server instructions per job of the hot paths"),
    "loop": ("loop_servers", "instructions per request of uvicorn and aiohttp on each loop"),
    "single": ("single", "one awaited single schedule beside the peers, both sides"),
}
# The tools each kind needs besides valgrind.
NEEDS = {
    "loop": ("callgrind_control",),
    "durable-redis": ("callgrind_control",),
    "single": ("callgrind_control",),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.probes.callgrind",
        description="Instruction counts under callgrind, one kind at a time.",
        epilog="; ".join(f"{kind}: {what}" for kind, (_, what) in KINDS.items()),
    )
    parser.add_argument("kind", choices=list(KINDS), help="what to count")
    parser.add_argument("options", nargs=argparse.REMAINDER, help="its options (KIND --help)")
    top = parser.parse_args(argv)
    name, what = KINDS[top.kind]
    module = importlib.import_module(f"bench.probes.callgrind.{name}")
    sub = argparse.ArgumentParser(prog=f"python -m bench.probes.callgrind {top.kind}")
    sub.description = what
    module.add_arguments(sub)
    args = sub.parse_args(top.options)
    tool = missing("valgrind", *NEEDS.get(top.kind, ()))
    if tool is not None:
        print(f"{tool} is not installed", file=sys.stderr)
        return 1
    result: int = module.run(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
