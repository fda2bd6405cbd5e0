"""``tickwheel demo`` and ``tickwheel wheel-demo``."""

from __future__ import annotations

import argparse

from ._args import (
    AddCommand,
    non_negative_int,
    positive_float,
    positive_int,
)
from ._common import (
    EXIT_FAILED,
    CliError,
    check_url,
    run,
)


def _demo(args: argparse.Namespace) -> int:
    from tickwheel.durable.ops._demo import run_demo  # noqa: PLC0415  (spawns workers)

    async def body() -> int:
        if args.redis_url is not None:
            check_url(args.redis_url)
        try:
            return await run_demo(
                args.redis_url, jobs=args.jobs, seconds=args.seconds, as_json=args.json
            )
        except RuntimeError as exc:  # no redis-server binary, a worker did not start
            raise CliError(EXIT_FAILED, str(exc)) from None

    return run(args, body)


def _wheel_demo(args: argparse.Namespace) -> int:
    from tickwheel.durable.ops._wheel_demo import wheel_demo  # noqa: PLC0415

    return wheel_demo(timers=args.timers, spread=args.spread, resets=args.resets, seed=args.seed)


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Add this group's commands (``add`` makes a subparser; ``common`` holds the
    options every Redis command takes)."""
    demo = add("demo", "wheel timers and durable jobs on an embedded Redis, a worker killed")
    demo.add_argument("--redis-url", help="use this Redis instead of an embedded one")
    demo.add_argument("--jobs", type=positive_int, default=2000, help="durable one-shot jobs")
    demo.add_argument("--seconds", type=positive_float, default=12.0, help="how long it runs")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.add_argument("-v", "--verbose", action="count", default=0, help="log to stderr")
    demo.set_defaults(func=_demo, needs_url=False)

    wdemo = add("wheel-demo", "the timing wheel beside asyncio's own timers, in memory")
    wdemo.add_argument("--timers", type=positive_int, default=100_000, help="how many timers")
    wdemo.add_argument(
        "--spread", type=positive_float, default=1.0, help="seconds over which they fall due"
    )
    wdemo.add_argument(
        "--resets", type=non_negative_int, default=20_000, help="how many are reset once"
    )
    wdemo.add_argument("--seed", type=int, default=1, help="random seed")
    wdemo.set_defaults(func=_wheel_demo, needs_url=False)
