"""Client-side instructions per job of the durable hot paths, counted by callgrind.

    python -m bench.probes.callgrind durable-client [--ops claim_ack,schedule_many,single,bare]
        [--durable-dir DIR]

Each operation (bench/workloads/durable_ops.py's hot paths) runs in a child
(``python -m bench.probes.callgrind.durable_client OP PORT N``) under
``valgrind --tool=callgrind`` twice, ``SMALL`` and ``LARGE`` jobs after the same set-up;
the difference of the two totals over ``LARGE - SMALL`` is the client process's
instruction count per job, free of start-up, imports and the set-up. The redis-server is
a separate process, not traced (``durable-redis`` counts it). ``--durable-dir`` runs the
children on another checkout's ``durable/`` (``git archive <commit> durable | tar -x -C
/tmp/old``, then ``/tmp/old/durable``), for a before/after of the same paths.
"""

from __future__ import annotations

import argparse
import asyncio
import os

if os.environ.get("TICKWHEEL_DURABLE_DIR"):  # --durable-dir: before anything imports it
    from bench.probes._checkout import load_durable

    load_durable(os.environ["TICKWHEEL_DURABLE_DIR"])

from bench.probes.callgrind._tools import child_args, child_command, count
from bench.workloads.durable_ops import (
    HOT_PATH_JOBS,
    HOT_PATHS,
    hot_path,
    hot_path_setup,
)
from bench.workloads.durable_ops import warm_hot_path as warm
from tickwheel.durable.servers import RedisServer

SMALL = 2_000
LARGE = HOT_PATH_JOBS
CHILD = "bench.probes.callgrind.durable_client"


async def _child(port: int, op: str, n: int) -> None:
    s, client = await hot_path_setup(port, op)
    await warm(s, op)
    await hot_path(s, op, n)
    await client.aclose()


def per_job(port: int, op: str) -> float:
    """Client instructions per job of ``op``, against the Redis on ``port``."""
    small, large = (count(child_command(CHILD, op, port, n)) for n in (SMALL, LARGE))
    return (large - small) / (LARGE - SMALL)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ops", default=",".join(HOT_PATHS), help="comma-separated paths")
    parser.add_argument("--durable-dir", default="", help="another checkout's durable/")


def run(args: argparse.Namespace) -> int:
    if args.durable_dir:  # the children load it (TICKWHEEL_DURABLE_DIR, above)
        os.environ["TICKWHEEL_DURABLE_DIR"] = args.durable_dir
    server = RedisServer().start()
    try:
        for op in args.ops.split(","):
            per = per_job(server.port, op)
            print(f"{op:<14} {per:>10,.0f} instructions per job (client process)", flush=True)
    finally:
        server.stop()
    return 0


def main() -> None:
    """The child: one hot path over N jobs, after its set-up, on the Redis at PORT."""
    op, port, n = child_args("one durable hot path", HOT_PATHS)
    asyncio.run(_child(port, op, n))


if __name__ == "__main__":
    main()
