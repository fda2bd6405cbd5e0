"""Job priorities (schedule(priority=)) and the claim's aging (Worker(priority_aging=)):
their bounds and checks. The order itself is the claim's (lua/_lib.lua: prio_lanes).
"""

from __future__ import annotations

from datetime import timedelta

from ._args import MAX_TIME_MS, finite_seconds_ms, int_between

__all__ = ["MAX_PRIORITY", "PRIORITY_AGING", "aging_ms", "check_aging", "check_priority"]

# Priorities are 0 (the default, lowest) .. MAX_PRIORITY. Ten levels, as Celery's and
# Oban's: enough to order kinds of work, few enough that a claim reads every level it
# needs (lua/_lib.lua: prio_lanes; MAX_PRIORITY there too). 0 is the lowest so that a
# namespace without priorities keeps its plain due order and claim cost.
MAX_PRIORITY = 9
# Seconds late after which a due job is claimed before any priority, oldest first: the
# bound on a low priority's wait under a sustained higher backlog (Worker(priority_aging=)).
PRIORITY_AGING = 60.0


def aging_ms(priority_aging: float | timedelta | None) -> int:
    """A claim's ``priority_aging`` (seconds, or None: no aging) as claim.lua takes it:
    whole ms, rounded up, or -1 for None.

    Raises:
        TypeError, ValueError: naming ``priority_aging``.
    """
    if priority_aging is None:
        return -1
    ms = finite_seconds_ms("priority_aging", priority_aging)
    return int_between("priority_aging", ms, 0, MAX_TIME_MS)


def check_aging(priority_aging: float | timedelta | None) -> float | timedelta | None:
    """``priority_aging`` as given, once :func:`aging_ms` accepts it.

    Raises:
        TypeError, ValueError: naming ``priority_aging``.
    """
    aging_ms(priority_aging)
    return priority_aging


def check_priority(priority: object) -> int:
    """A job's priority checked: an int in 0 .. :data:`MAX_PRIORITY` (not a bool).

    Raises:
        TypeError, ValueError: naming ``priority``.
    """
    return int_between("priority", priority, 0, MAX_PRIORITY)
