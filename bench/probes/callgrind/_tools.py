"""What every callgrind probe shares: counting a process, and a redis-server under
callgrind whose counters are zeroed and dumped on demand.

A probe's figure is a difference: a process runs twice, with a small and a large count
of operations after the same set-up, and the difference of the two totals over the
extra operations is the count per operation, free of start-up, imports and set-up.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository: children import bench
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
_TOTAL = re.compile(r"^(?:summary|totals):\s*(\d+)", re.MULTILINE)


def missing(*tools: str) -> str | None:
    """The first of ``tools`` (default: valgrind) not on PATH, or None."""
    for tool in tools or ("valgrind",):
        if shutil.which(tool) is None:
            return tool
    return None


def child_command(module: str, what: str, port: int, n: int) -> list[str]:
    """The command of a counted child: ``python -m MODULE WHAT PORT N`` (what to run,
    the Redis it talks to, how many operations)."""
    return [sys.executable, "-m", module, what, str(port), str(n)]


def child_args(description: str, choices: Sequence[str]) -> tuple[str, int, int]:
    """A counted child's own arguments: what to run (one of ``choices``), the port of
    its Redis, how many operations."""
    parser = argparse.ArgumentParser(description=f"{description} (a child, counted)")
    parser.add_argument("what", choices=choices)
    parser.add_argument("port", type=int)
    parser.add_argument("n", type=int)
    args = parser.parse_args()
    return args.what, args.port, args.n


def count(cmd: list[str]) -> int:
    """Instructions of ``cmd`` run to its end under callgrind (the repository as its
    working directory). The hash seed is fixed (unless ``PYTHONHASHSEED`` is set): with
    a random one, dict and attribute lookups of identical code moved the durable
    per-job counts by several hundred instructions from run to run."""
    proc = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")},
    )
    match = _COLLECTED.search(proc.stderr)
    if proc.returncode != 0 or match is None:
        raise RuntimeError(f"no callgrind total ({cmd[:4]}...):\n{proc.stderr[-3000:]}")
    return int(match.group(1))


def total_in(path: str) -> int:
    """The total of a callgrind output file (one dump)."""
    with open(path) as f:
        match = _TOTAL.search(f.read())
    if match is None:
        raise RuntimeError(f"no callgrind total in {path}")
    return int(match.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TracedServer:
    """A private redis-server, under callgrind (counters zeroed and dumped on demand) or
    not (``traced=False``: a plain server beside it, for what callgrind would blur)."""

    def __init__(self, tmp: str, traced: bool) -> None:
        self.tmp = tmp
        self.port = free_port()
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server not found on PATH")
        tracer = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/server.%p"]
        self.proc = subprocess.Popen(
            [
                *(tracer if traced else []),
                *(binary, "--port", str(self.port), "--save", "", "--appendonly", "no"),
                *("--dir", tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.dumps = 0
        deadline = time.monotonic() + 60
        while True:  # up once it answers a connection
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.2)

    def _control(self, flag: str) -> None:
        subprocess.run(
            ["callgrind_control", flag, str(self.proc.pid)], check=True, capture_output=True
        )

    def zero(self) -> None:
        """Zero the instruction counters."""
        self._control("-z")

    def dump(self) -> int:
        """Instructions since the last zero."""
        self._control("-d")
        self.dumps += 1
        path = f"{self.tmp}/server.{self.proc.pid}.{self.dumps}"
        deadline = time.monotonic() + 30
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the dump is written whole before the next zero
        return total_in(path)

    def stop(self) -> None:
        self.proc.terminate()  # by its pid: a Redis the machine already runs is untouched
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
