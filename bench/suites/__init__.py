"""The pytest-benchmark suites: ``pytest bench/suites/bench_X.py --benchmark-only``.

``bench_wheel`` (the wheel against asyncio's loop and uvloop), ``bench_durable`` (the
durable scheduler on one Redis, arq beside it), ``bench_spill`` (``Timers`` and the
``Loader``) and ``bench_cluster`` (a Redis Cluster beside one Redis). conftest.py
prints every group as ratios to its base row. Outside the main suite's test paths.
"""
