"""Cron in IANA time zones: occurrences across DST changes, against a reference written
here that walks local wall times minute by minute (not cronsim), and bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwheel.durable import Recurrence, Scheduler
from tickwheel.durable.model import JobSpec
from tickwheel.durable.store._codec import encode_job, recurrence_of

MIN = 60_000
HOUR = 3_600_000
ZONES = (
    "Europe/Paris",
    "America/New_York",
    "Australia/Lord_Howe",  # 30-minute DST
    "America/Santiago",  # transitions at midnight
    "Europe/Dublin",  # negative DST in the rules
    "Africa/Casablanca",  # frequent rule changes (Ramadan)
)
YEARS = range(2022, 2027)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# -- the reference: a cron matcher and a minute-by-minute walk ---------------------------


def _field(text: str, low: int, high: int) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        rng, _, step = part.partition("/")
        if rng == "*":
            a, b = low, high
        elif "-" in rng:
            a, b = (int(x) for x in rng.split("-"))
        else:
            a = b = int(rng)
        out.update(range(a, b + 1, int(step) if step else 1))
    return out


def _matcher(expr: str):  # type: ignore[no-untyped-def]
    parts = expr.split()
    sec = _field(parts.pop(0), 0, 59) if len(parts) == 6 else {0}
    mins, hours = _field(parts[0], 0, 59), _field(parts[1], 0, 23)
    assert parts[2:] == ["*", "*", "*"]  # the table uses every day
    return lambda w: w.second in sec and w.minute in mins and w.hour in hours


def _ms(dt: datetime) -> int:
    return (dt - _EPOCH) // timedelta(milliseconds=1)


def _wall(tz: ZoneInfo, t: int) -> datetime:
    return (_EPOCH + timedelta(milliseconds=t)).astimezone(tz).replace(tzinfo=None)


def _real(tz: ZoneInfo, w: datetime) -> bool:
    return _wall(tz, _ms(w.replace(tzinfo=tz))) == w


def reference(expr: str, tz: ZoneInfo, lo: int, hi: int) -> list[int]:
    """Occurrences in [lo, hi], by Debian cron's rules, minute by minute."""
    match = _matcher(expr)
    parts = expr.split()
    fixed = len(parts) == 5 and not parts[0].startswith("*") and not parts[1].startswith("*")
    out: set[int] = set()
    if fixed:  # every matching wall time: its first pass, or the first real minute after
        w, end = _wall(tz, lo) - timedelta(hours=3), _wall(tz, hi) + timedelta(hours=3)
        while w <= end:
            if match(w):
                v = w
                while not _real(tz, v):
                    v += timedelta(minutes=1)
                out.add(_ms(v.replace(tzinfo=tz, fold=0)))
            w += timedelta(minutes=1)
    else:  # every instant whose wall time matches
        step = 1_000 if len(parts) == 6 else MIN
        for t in range(lo - lo % step, hi + 1, step):
            if match(_wall(tz, t)):
                out.add(t)
    return sorted(u for u in out if lo <= u <= hi)


def transitions(zone: str, year: int) -> list[int]:
    """The instants the zone's offset changes in ``year`` (found by probing hourly)."""
    tz = ZoneInfo(zone)
    t = _ms(datetime(year, 1, 1, tzinfo=UTC))
    end = _ms(datetime(year + 1, 1, 1, tzinfo=UTC))

    def off(x: int) -> timedelta | None:
        return (_EPOCH + timedelta(milliseconds=x)).astimezone(tz).utcoffset()

    out = []
    while t < end:
        if off(t) != off(t + HOUR):
            lo, hi = t, t + HOUR
            while hi - lo > MIN:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if off(mid) == off(lo) else (lo, mid)
            out.append(hi)
        t += HOUR
    return out


FIXED = ["30 2 * * *", "0 0 * * *", "45 1 * * *", "15,45 2 * * *", "0 1-3 * * *", "30 0 * * *"]
ELAPSED = ["*/15 * * * *", "0 * * * *", "*/30 2 * * *", "10 */2 * * *", "0 */20 * * * *"]
CASES = [(z, y) for z in ZONES for y in YEARS]


def _series(rec: Recurrence, lo: int, hi: int) -> list[int]:
    out, t = [], lo - 1
    while (t := rec.next_after(t, 0)) <= hi:
        out.append(t)
    return out


@pytest.mark.parametrize(("zone", "year"), CASES, ids=[f"{z}-{y}" for z, y in CASES])
def test_dst_transitions_match_the_minute_by_minute_reference(zone: str, year: int) -> None:
    tz = ZoneInfo(zone)
    found = transitions(zone, year)
    assert found or zone == "Africa/Casablanca"  # every table zone changes offset yearly
    for change in found:
        lo, hi = change - 4 * HOUR, change + 4 * HOUR
        for expr in FIXED + ELAPSED:
            rec = Recurrence.cron_expr(expr, tz=zone)
            want = reference(expr, tz, lo, hi)
            got = _series(rec, lo, hi)
            assert got == want, (zone, expr, datetime.fromtimestamp(change / 1000, UTC))
            for prev, o in zip([None, *got], got, strict=False):
                assert rec.last_at_or_before(o, 0) == o
                if prev is not None:
                    assert rec.last_at_or_before(o - 1, 0) == prev
            # From any instant (every 5 minutes, inside a repeated hour too).
            for t in range(change - 3 * HOUR, change + 3 * HOUR, 5 * MIN + 7_000):
                before = [o for o in want if o <= t]
                after = [o for o in want if o > t]
                if before:
                    assert rec.last_at_or_before(t, 0) == before[-1], (zone, expr, t)
                if after:
                    assert rec.next_after(t, 0) == after[0], (zone, expr, t)


def test_the_documented_examples() -> None:
    def local(zone: str, t: int) -> str:
        return (_EPOCH + timedelta(milliseconds=t)).astimezone(ZoneInfo(zone)).isoformat()

    def first(expr: str, zone: str, after: str) -> list[str]:
        rec = Recurrence.cron_expr(expr, tz=zone)
        t = _ms(datetime.fromisoformat(after).replace(tzinfo=ZoneInfo(zone)))
        out = []
        for _ in range(4):
            t = rec.next_after(t, 0)
            out.append(local(zone, t))
        return out

    # Spring forward, Paris: 02:30 does not exist on 2026-03-29; it runs at 03:00.
    assert first("30 2 * * *", "Europe/Paris", "2026-03-28T12:00")[:2] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]
    # Fall back, Paris: 02:30 happens twice on 2026-10-25; it runs at the first pass.
    assert first("30 2 * * *", "Europe/Paris", "2026-10-24T12:00")[:2] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    # Elapsed time: */30 gets both passes of the repeated hour.
    assert first("*/30 * * * *", "Europe/Paris", "2026-10-25T01:45") == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
    ]
    # Santiago's midnight does not exist on 2026-09-06: a daily midnight runs at 01:00.
    assert first("0 0 * * *", "America/Santiago", "2026-09-05T12:00")[:2] == [
        "2026-09-06T01:00:00-03:00",
        "2026-09-07T00:00:00-03:00",
    ]
    # Lord Howe's 30-minute change: 02:15 falls in the gap of 2026-10-04.
    assert first("15 2 * * *", "Australia/Lord_Howe", "2026-10-03T12:00")[:2] == [
        "2026-10-04T02:30:00+11:00",
        "2026-10-05T02:15:00+11:00",
    ]


# -- properties ---------------------------------------------------------------------------

_part = st.sampled_from(["*", "0", "30", "*/15", "5,35", "0-10", "1-3", "2", "*/7"])
_expr = st.one_of(
    st.tuples(_part, st.sampled_from(["*", "0", "2", "1-3", "*/6", "0,2,23", "23"])).map(
        lambda p: f"{p[0]} {p[1]} * * *"
    ),
    st.tuples(st.sampled_from(["0", "*/20", "30"]), _part).map(lambda p: f"{p[0]} {p[1]} * * * *"),
    st.sampled_from(["0 0 1 * *", "0 3 * * SUN", "30 1 L * *"]),
)
_start = st.integers(_ms(datetime(2000, 1, 1, tzinfo=UTC)), _ms(datetime(2035, 1, 1, tzinfo=UTC)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=_expr, zone=st.sampled_from(ZONES), start=_start)
def test_occurrences_increase_and_both_directions_agree(expr: str, zone: str, start: int) -> None:
    rec = Recurrence.cron_expr(expr, tz=zone)
    seen: list[int] = []
    t = start
    for _ in range(8):
        o = rec.next_after(t, 0)
        assert o > t
        assert rec.last_at_or_before(o, 0) == o  # an occurrence is its own last
        assert rec.last_at_or_before(o - 1, 0) <= t  # nothing skipped between t and o
        if seen:
            assert rec.last_at_or_before(o - 1, 0) == seen[-1]
        seen.append(o)
        t = o
    assert seen == sorted(set(seen))
    back = rec.last_at_or_before(start, 0)
    assert back <= start < rec.next_after(back, 0)


# -- storage ----------------------------------------------------------------------------


def test_the_zone_round_trips_through_the_record_and_old_records_read_utc() -> None:
    rec = Recurrence.cron_expr("0 9 * * *", tz="Europe/Paris")
    assert rec.spec == "TZ=Europe/Paris 0 9 * * *"
    spec = JobSpec("a", "t", b"", None, None, 5, rec)
    assert b"TZ=Europe/Paris 0 9 * * *" in encode_job(spec, 1024).values[3]
    assert recurrence_of(2, rec.spec.encode(), 0, rec.max_catch_up, rec.misfire_grace_ms) == rec
    old = recurrence_of(2, b"0 9 * * *", 0, 100, 60_000)
    assert old is not None and old.tz == "" and old == Recurrence.cron_expr("0 9 * * *")


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["Europe/Nowhere", "", "Europe/Paris ", "../etc/passwd", "UTC+1"])
def test_an_unknown_zone_is_a_value_error_naming_tz(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^tz "):
        Recurrence.cron_expr("0 9 * * *", tz=bad)
    with pytest.raises(ValueError, match=r"^tz "):
        Scheduler.recurrence(cron="0 9 * * *", tz=bad)


@pytest.mark.parametrize("bad", [1, b"Europe/Paris", ZoneInfo("Europe/Paris")])
def test_a_zone_that_is_not_a_str_is_a_type_error_naming_tz(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^tz "):
        Recurrence.cron_expr("0 9 * * *", tz=bad)  # type: ignore[arg-type]


def test_a_zone_without_cron_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^tz needs cron"):
        Scheduler.recurrence(tz="Europe/Paris")
    with pytest.raises(ValueError, match=r"^tz needs cron"):
        Scheduler.recurrence(every=60, tz="Europe/Paris")


# -- end to end, real Redis ---------------------------------------------------------------


def test_a_zoned_series_runs_each_occurrence_once_across_a_gap_and_a_zone_change(
    redis_url: str,
) -> None:
    from tests.durable_support import client_of, open_scheduler, run

    # Europe/Paris springs forward at 2030-03-31 01:00Z (02:00 -> 03:00 local); the
    # shard's clock is placed there (now = max(TIME, clock)).
    def z(*a: int) -> int:
        return _ms(datetime(*a, tzinfo=UTC))  # type: ignore[misc]

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            await s.take(0)

            async def at(t: int) -> list[int]:
                await client_of(s).set(s.keys.shard(0).clock, t)
                batch = await s.claim(0, limit=100)
                for job in batch.jobs:
                    await s.ack(job)
                return [j.nominal_ms for j in batch.jobs]

            expr = "0,30 1-3 * * *"  # fixed-time: 02:00 and 02:30 fall in the gap
            await client_of(s).set(s.keys.shard(0).clock, z(2030, 3, 30, 23, 50))
            first = Recurrence.cron_expr(expr, tz="Europe/Paris").next_after(
                z(2030, 3, 30, 23, 50), 0
            )
            await s.schedule("z", "t", at=first, cron=expr, tz="Europe/Paris", missed="all")
            runs: list[int] = []
            for t in range(z(2030, 3, 31, 0), z(2030, 3, 31, 1, 31), 10 * MIN):
                runs += await at(t)
            # 01:00+01, 01:30+01, then the gap's 02:00 and 02:30 and 03:00 as one run
            # at 03:00+02 (01:00Z), then 03:30+02.
            assert runs == [
                z(2030, 3, 31, 0),
                z(2030, 3, 31, 0, 30),
                z(2030, 3, 31, 1),
                z(2030, 3, 31, 1, 30),
            ]
            info = await s.get("z")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == "Europe/Paris"
            assert info.when_ms == z(2030, 3, 31, 23)  # 01:00+02 the next day
            # Replace the zone: the next occurrence follows New York (01:00-04 = 05:00Z),
            # and the one already run is not run again.
            nxt = Recurrence.cron_expr(expr, tz="America/New_York").next_after(
                z(2030, 3, 31, 1, 31), 0
            )
            res = await s.schedule("z", "t", at=nxt, cron=expr, tz="America/New_York", replace=True)
            assert res.status.name.lower() == "replaced"
            later = await at(nxt)
            assert later == [z(2030, 3, 31, 5)]
            info = await s.get("z")
            assert info is not None and info.recurrence is not None
            assert info.recurrence.tz == "America/New_York"
            assert info.when_ms == z(2030, 3, 31, 5, 30)

    run(main())


def test_bad_zones_write_nothing(redis_url: str) -> None:
    from tests.durable_support import open_scheduler, run

    async def main() -> None:
        async with open_scheduler(redis_url, shards=1) as s:
            for kwargs in (
                {"cron": "0 9 * * *", "tz": "Mars/Olympus"},
                {"cron": "0 9 * * *", "tz": 3},
                {"tz": "Europe/Paris"},
                {"every": 60, "tz": "Europe/Paris"},
            ):
                with pytest.raises((TypeError, ValueError), match="tz"):
                    await s.schedule("bad", "t", **kwargs)  # type: ignore[arg-type]
                assert await s.get("bad") is None

    run(main())
