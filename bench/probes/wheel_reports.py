"""The wheel's figures that are not times, as tables: memory per pending timer, idle
wake-ups and firing lateness, beside asyncio's loop and uvloop (about 1.5 minutes for
``all``; bench/workloads/wheel_reports.py says how each is measured).

    .venv/bin/python -m bench.probes.wheel_reports memory|idle|lateness|all
"""

from __future__ import annotations

import argparse

from bench.workloads.wheel_reports import idle_report, lateness_report, memory_report

REPORTS = {"memory": memory_report, "idle": idle_report, "lateness": lateness_report}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("what", choices=[*REPORTS, "all"])
    args = parser.parse_args(argv)
    for name, report in REPORTS.items():
        if args.what in (name, "all"):
            print(report()[0], end="\n\n", flush=True)


if __name__ == "__main__":
    main()
