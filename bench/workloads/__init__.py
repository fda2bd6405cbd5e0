"""What the benchmarks measure, written once and used by every harness of bench/.

The wheel's timed operations (``wheel_ops``) and its other figures (``wheel_reports``),
the network-server scenario (``server_scenario``), the durable scheduler's hot paths
(``durable_ops``) and lateness runs (``durable_lateness``). No command line and no
report here: ``python -m bench`` (bench/runner/), the pytest-benchmark suites
(bench/suites/) and the probes (bench/probes/) time, count or print them.
"""
