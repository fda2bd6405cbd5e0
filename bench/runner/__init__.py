"""``python -m bench``'s side-by-side report: one module per section, and what they share.

Sections (each with ``steps(plan)`` and ``run(plan, progress, checks)``): ``wheel``,
``server``, ``durable``, ``example`` and ``postgres``. ``harness`` holds the plan of a
run (full or ``--quick``), the progress bar, figures and correctness checks; ``report``
writes report.md, results.json, summary.md and the plots. The command itself is
bench/__main__.py. What each section measures is built in bench/workloads/, and every
peer library is driven through bench/peers/.
"""
