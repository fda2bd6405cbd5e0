"""One-off measurements, each its own command: ``python -m bench.probes.NAME``.

Counts and profiles: ``callgrind`` (instructions per operation, one kind at a time),
``profile`` (cProfile of the durable hot paths; the wheel's hot paths looped for py-spy).
Comparisons: ``durable_compare`` (tickwheel, arq and BullMQ in interleaved rounds),
``lateness_vs_peers`` (firing lateness beside a peer's worker), ``wheel_reports``
(memory, idle wake-ups, lateness of the wheel and the loops), ``server_scenario`` (idle
timeouts reset per request), ``loop_servers`` (uvicorn and aiohttp on the wheel-timed
event loops beside the stdlib loop and uvloop), ``cpython_asyncio`` (CPython's asyncio
test suites on the wheel-timed loop), ``pg_mode`` and ``pg_driver`` (the Postgres mode; its
driver). Scale and failure: ``scale`` (the worked example up to 1e7 pending),
``cluster_failover`` (what a master's death loses), ``kill_recovery`` (how soon a
SIGKILLed worker's unstarted jobs and shards are taken over), ``prestart_cost`` (what
pre-start leases cost a worker), ``pg_bloat`` (table bloat under autovacuum). The
dashboard: ``dashboard_latency``, ``dashboard_screenshot``.
bench/README.md says what each measured, and when.
"""
