"""Pin the public names of tickwheel.durable (trio's test_exports)."""

from __future__ import annotations

from tickwheel import durable


def test_all_is_pinned() -> None:
    assert len(set(durable.__all__)) == len(durable.__all__)
    assert sorted(durable.__all__) == sorted(
        [
            "MAX_JOB_ID_BYTES",
            "MAX_KEY_BYTES",
            "BrokerMisconfigured",
            "BrokerUnavailable",
            "CancelResult",
            "MAX_PAYLOAD_DEPTH",
            "MAX_PRIORITY",
            "PRIORITY_AGING",
            "ClaimBatch",
            "Client",
            "DeadPage",
            "Defer",
            "DurableError",
            "Fenced",
            "Job",
            "JobInfo",
            "JobSpec",
            "JobState",
            "KeyState",
            "Keys",
            "LeaseLost",
            "Limits",
            "ListingTooLong",
            "Loader",
            "LoaderStats",
            "MissedRun",
            "NotOwner",
            "Ownership",
            "PostgresModeRequired",
            "PostgresUnavailable",
            "Publisher",
            "ReapResult",
            "Reaper",
            "Recurrence",
            "RedisConfigError",
            "RedisUnavailable",
            "ReplicationTimeout",
            "ScheduleResult",
            "ScheduleStatus",
            "Scheduler",
            "SchedulerStats",
            "SchemaNotReady",
            "ServerCheckFailed",
            "ServerConfigWarning",
            "ServerReport",
            "ShardCountMismatch",
            "ShardInfo",
            "Store",
            "StreamConsumer",
            "StreamEntry",
            "StreamPublisher",
            "SyncScheduler",
            "TaskContext",
            "TaskHandle",
            "TaskRegistry",
            "Timers",
            "UndecodablePayload",
            "Worker",
            "check_server",
            "connect",
        ]
    )
    for name in durable.__all__:
        assert getattr(durable, name) is not None, name


def test_errors_say_transient_or_permanent() -> None:
    assert durable.RedisUnavailable.transient
    assert durable.ReplicationTimeout.transient
    assert durable.PostgresUnavailable.transient
    for cls in (
        durable.Fenced,
        durable.LeaseLost,
        durable.ListingTooLong,
        durable.NotOwner,
        durable.ShardCountMismatch,
        durable.ServerCheckFailed,
        durable.SchemaNotReady,
    ):
        assert issubclass(cls, durable.DurableError)
        assert not cls.transient, cls
