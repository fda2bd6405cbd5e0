"""The network-server scenario as a table: each server's CPU per request, requests/s and
how late its idle connections were closed (bench/workloads/server_scenario.py).

    .venv/bin/python -m bench.probes.server_scenario --conns 10000 [--rounds 5] [--idle 5]
        [--uvloop]
"""

from __future__ import annotations

import argparse
import os
import statistics

from bench.workloads.server_scenario import MODES, run_mode


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--conns", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--idle", type=float, default=5.0, help="idle timeout (s); must outlast opening all"
    )
    parser.add_argument("--uvloop", action="store_true", help="run both sides on uvloop")
    args = parser.parse_args(argv)
    print(
        f"{args.conns:,} connections, {args.rounds} rounds, idle timeout {args.idle:g} s, "
        f"{'uvloop' if args.uvloop else 'stdlib loop'}, server pid != client pid "
        f"(client {os.getpid()})"
    )
    print(
        f"{'server':24} {'CPU us/req':>10} {'user us':>8} {'req/s':>9} "
        f"{'close late p50':>15} {'p99':>8} {'max':>8} {'early':>6}"
    )
    for mode in MODES:
        r = run_mode(mode, args.conns, args.rounds, args.idle, uvloop=args.uvloop)
        late = r["idle_late"]
        p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
        print(
            f"{mode:24} {r['cpu'] / r['requests'] * 1e6:>10.2f} "
            f"{r['cpu_user'] / r['requests'] * 1e6:>8.2f} "
            f"{r['requests'] / r['wall']:>9,.0f} {statistics.median(late) * 1e3:>13.1f}ms "
            f"{p99 * 1e3:>6.1f}ms {late[-1] * 1e3:>6.1f}ms {sum(x < 0 for x in late):>6}",
            flush=True,
        )


if __name__ == "__main__":
    main()
