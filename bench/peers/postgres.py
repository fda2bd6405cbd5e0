"""The PostgreSQL job queues the Postgres mode is measured against: procrastinate, pgqueuer.

Each peer is one round of the Postgres mode's figures (bench/workloads/durable_ops.py's
:func:`~bench.workloads.durable_ops.mode_round`), on its own tables in the same
PostgreSQL, as microseconds per job under the same names (:data:`FIGURES`):

- procrastinate: ``defer_async`` per job, ``batch_defer_async`` of all the jobs, and
  ``fetch_job`` + ``finish_job`` (its worker's claim and ack, one job each: it has no
  batch claim);
- pgqueuer: ``enqueue`` of one job per call, ``enqueue`` of all the jobs in one call,
  and ``dequeue`` of 100 + ``log_jobs`` (its ack) per batch.

procrastinate is in the ``bench`` extra; pgqueuer is not (bullmq, in that extra, pins a
croniter that pgqueuer 1.x cannot use): it runs here when pgqueuer 1.x is installed, and
otherwise in a venv of its own that the bench makes on first use (:func:`pgqueuer_python`).
:func:`installed` gives the peers that can run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncpg

# The figures of a round, in microseconds per job (the Postgres mode's own round too).
FIGURES = ("schedule (us/job)", "schedule_many (us/job)", "claim+ack (us/job)")

Round = Callable[[str, int], Awaitable[dict[str, float]]]

# pgqueuer's venv (pgqueuer_python) and what is installed there.
_VENV = Path(__file__).resolve().parents[2] / ".venv-pgqueuer"
_PGQUEUER_REQS = ("pgqueuer>=1.0,<2", "asyncpg>=0.29")
_CHILD = Path(__file__).resolve().parent / "_pgqueuer.py"


async def pgqueuer_round(pg_url: str, jobs: int) -> dict[str, float]:
    """pgqueuer's counterparts of the Postgres mode's figures, on its own tables: in this
    process when pgqueuer 1.x imports here, else in the venv :func:`pgqueuer_python`
    makes (the round times itself, so the process boundary is outside every figure)."""
    if _pgqueuer_here():
        from bench.peers._pgqueuer import round_

        return await round_(pg_url, jobs)
    python = await asyncio.to_thread(pgqueuer_python)
    proc = await asyncio.create_subprocess_exec(
        str(python), str(_CHILD), pg_url, str(jobs), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"pgqueuer's round exited {proc.returncode}")
    got: dict[str, float] = json.loads(out)
    return got


def _pgqueuer_here() -> bool:
    """Whether pgqueuer 1.x imports in this venv (0.x has another API)."""
    try:
        from importlib.metadata import version

        return int(version("pgqueuer").split(".")[0]) >= 1
    except Exception:
        return False


def pgqueuer_python() -> Path:
    """The python of a venv holding pgqueuer 1.x (``.venv-pgqueuer/`` at the repository
    root, gitignored), made with this interpreter's ``venv`` and ``pip`` on first use.

    Raises:
        RuntimeError: if the venv cannot be made or pgqueuer not installed in it.
    """
    python = _VENV / "bin" / "python"
    if python.exists() and _stamp_ok():
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *_PGQUEUER_REQS],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"could not make pgqueuer's venv in {_VENV}: {exc}") from exc
    (_VENV / "tickwheel-bench-stamp").write_text(" ".join(_PGQUEUER_REQS))
    return python


def pgqueuer_ready() -> bool:
    """Whether pgqueuer's round can run without installing anything."""
    return _pgqueuer_here() or ((_VENV / "bin" / "python").exists() and _stamp_ok())


def _stamp_ok() -> bool:
    stamp = _VENV / "tickwheel-bench-stamp"
    return stamp.exists() and stamp.read_text() == " ".join(_PGQUEUER_REQS)


async def procrastinate_round(pg_url: str, jobs: int) -> dict[str, float]:
    """procrastinate's counterparts of the Postgres mode's figures, on its own tables."""
    import procrastinate
    from procrastinate import jobs as pjobs

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url))

    @app.task(name="t")
    async def task(p: str) -> None:
        del p

    out: dict[str, float] = {}
    async with app.open_async():
        conn: Any = await asyncpg.connect(pg_url)
        try:
            if await conn.fetchval("SELECT to_regclass('procrastinate_jobs')") is None:
                await app.schema_manager.apply_schema_async()
        finally:
            await conn.close()
        t = time.perf_counter()
        for _ in range(jobs):
            await task.defer_async(p="payload")
        out["schedule (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        t = time.perf_counter()
        await task.batch_defer_async(*[{"p": "payload"}] * jobs)
        out["schedule_many (us/job)"] = (time.perf_counter() - t) / jobs * 1e6
        worker = await app.job_manager.register_worker()
        done = 0
        t = time.perf_counter()
        while (job := await app.job_manager.fetch_job(None, worker)) is not None:
            await app.job_manager.finish_job(job, pjobs.Status.SUCCEEDED, False)
            done += 1
        out["claim+ack (us/job)"] = (time.perf_counter() - t) / max(done, 1) * 1e6
        await app.job_manager.unregister_worker(worker)
    return out


ROUNDS: dict[str, Round] = {"procrastinate": procrastinate_round, "pgqueuer": pgqueuer_round}


def installed(names: Sequence[str]) -> dict[str, Round]:
    """The rounds of the peers in ``names`` (in that order) that can run: whose library
    imports here, and pgqueuer always (in its own venv when it does not import here)."""
    out: dict[str, Round] = {}
    for name in names:
        if name == "pgqueuer":  # here, or in a venv of its own
            out[name] = ROUNDS[name]
            continue
        try:
            __import__(name)
        except ImportError:
            continue
        out[name] = ROUNDS[name]
    return out
