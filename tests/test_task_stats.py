"""The per-task counters of a worker: counted by name, bounded, and their sample."""

from __future__ import annotations

from tickwheel.durable.runtime import MAX_TASKS, TASK_FIELDS
from tickwheel.durable.runtime._task_stats import OTHER_TASKS, TaskCounters
from tickwheel.durable.store import parse_sample, parse_stats_document


def test_counts_each_outcome_and_the_lateness_bucket_per_task() -> None:
    counters = TaskCounters()
    counters.fired("send", 0.004)
    counters.fired("send", 2.0)
    counters.acked("send")
    counters.retried("send")
    counters.dead("bill")
    send = counters.snapshot()["send"]
    runs, acked, retries, dead, late_us, *lat = send
    assert (runs, acked, retries, dead) == (2, 1, 1, 0) and late_us == 2_004_000
    assert len(TASK_FIELDS) == 5 and len(lat) == 16
    assert lat[2] == 1 and lat[10] == 1  # <= 5 ms and <= 2.5 s
    assert counters.snapshot()["bill"][:4] == [0, 0, 0, 1]
    snap = counters.snapshot()
    snap["send"][0] = 99
    assert counters.snapshot()["send"][0] == 2  # a copy


def test_task_names_past_the_bound_are_counted_together() -> None:
    counters = TaskCounters()
    for i in range(MAX_TASKS + 50):
        counters.acked(f"t{i}")
    snap = counters.snapshot()
    assert len(snap) == MAX_TASKS + 1
    assert snap[OTHER_TASKS][1] == 50 and snap["t0"][1] == 1


def test_documents_and_samples_of_another_shape_read_as_none() -> None:
    ok = '{"v":1,"t":5,"c":[1],"tasks":{"a":[1,2]}}'
    assert parse_stats_document(ok) is not None
    assert parse_stats_document('{"v":1,"t":5,"c":[1],"tasks":{"a":["x"]}}') is None
    assert parse_stats_document('{"v":1,"t":5,"c":[1],"tasks":[1]}') is None
    assert parse_sample('{"dt":1000,"c":[1,2],"tasks":{"a":[1]}}') is not None
    for bad in ('{"dt":0,"c":[1]}', '{"c":[1]}', '{"dt":5,"c":"x"}', "[]", "nope", None):
        assert parse_sample(bad) is None, bad
