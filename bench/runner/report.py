"""Writing ``python -m bench``'s results: report.md, results.json, summary.md, PNG plots."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

# The figures of the README's summary: (section, name prefix, peer) of each row.
SUMMARY_ROWS = (
    ("wheel", "schedule+cancel N=1e6", "asyncio"),
    ("wheel", "reschedule N=1e6", "asyncio"),
    ("wheel", "fire N=1e6", "asyncio"),
    ("wheel", "memory per pending timer N=1e6", "asyncio"),
    ("wheel", "schedule+cancel N=1e6", "uvloop"),
    ("wheel", "reschedule N=1e6", "uvloop"),
    ("server", "CPU per request, protocol/wheel", "call_later"),
    ("server", "CPU per request, stream/wheel.timeout", "asyncio.timeout"),
    *(
        ("durable", name, peer)
        for peer in ("arq", "bullmq", "saq", "streaq")
        for name in (
            "bulk schedule",
            "single schedule",
            "claim+run+ack",
            "Redis memory per pending job",
            "firing lateness p99 at 1,000",
        )
    ),
    ("example", "claim capacity per shard (claim only)", "the document's 5,000/s"),
    ("limits", "claim+run+ack, concurrency=4, 10 a key", "limits off"),
    ("limits", "claim+run+ack, concurrency=4, 5 a key", "limits off"),
    ("limits", "rate 10/s", "bullmq limiter (per queue)"),
    *(
        ("postgres", f"Postgres mode {name}", "procrastinate")
        for name in ("schedule", "schedule_many", "claim+ack")
    ),
)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 10:
        return f"{x:.1f}"
    if a >= 0.01:
        return f"{x:.3g}"
    return f"{x:.3g}"


def _raw(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "s/op":
        return f"{x * 1e9:.0f} ns/op"
    return f"{_num(x)} {unit}"


def _ratio(d: dict[str, Any]) -> str:
    return (
        f"**{_num(d['ratio_median'])}x** ({_num(d['ratio_min'])}-{_num(d['ratio_max'])})"
        if d["ratio_median"] is not None
        else "-"
    )


def figure_table(figs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| figure | peer | tickwheel | peer's | tickwheel's advantage, median (min-max) |",
        "|---|---|---:|---:|---:|",
    ]
    for d in figs:
        lines.append(
            f"| {d['name']} | {d['peer']} | {_raw(d['ours_median'], d['unit'])} | "
            f"{_raw(d['theirs_median'], d['unit'])} | {_ratio(d)} |"
        )
    return lines


def summary_figures(figs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for section, prefix, peer in SUMMARY_ROWS:
        for d in figs:
            if d["section"] == section and d["name"].startswith(prefix) and d["peer"] == peer:
                out.append(d)
                break
    return out


def _machine_line(m: dict[str, str]) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, Python {m['python']}, redis-server "
        f"{m['redis-server']}, redis-py {m['redis-py']}, uvloop {m['uvloop']}, arq {m['arq']}, "
        f"bullmq {m.get('bullmq', '-')}, saq {m.get('saq', '-')}, streaq {m.get('streaq', '-')}"
    )


def write(out: Path, results: dict[str, Any]) -> list[Path]:
    """Write every file into ``out``; return the plots written."""
    out.mkdir(parents=True, exist_ok=True)
    written = plots(out, results)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    figs = results["figures"]
    m = results["machine"]
    lines = [
        "# tickwheel benchmark report",
        "",
        f"{results['date']}, {'--quick' if results['quick'] else 'full run'}, "
        f"{results['repeats']} repeat(s), {results['elapsed_s']:.0f} s.",
        "",
        "Machine: " + _machine_line(m) + f"; load average at the start {m['load average']}.",
        "",
        "Every figure is a ratio to its peer measured in the same run, repeat by repeat: "
        "the median of the per-repeat ratios, with their min and max. Above 1 means "
        "tickwheel is better (the peer's cost over tickwheel's, or tickwheel's rate over "
        "the peer's). The raw columns are medians over the repeats. The machine is shared "
        "and noisy: compare ratios, not raw figures across runs.",
        "",
    ]
    titles = {
        "wheel": "1. The wheel against asyncio's loop and uvloop",
        "server": "2. The network-server scenario",
        "durable": "3. Durable jobs against arq, BullMQ, saq and streaq",
        "example": "4. The worked example (16 shards, peak 2,900 jobs/s)",
        "postgres": "5. The Postgres mode against procrastinate and pgqueuer",
        "brokers": "6. The publish handoff on NATS and RabbitMQ, against taskiq",
        "limits": "7. Per-key flow limits, against no limits and BullMQ's global limiter",
        "loop": "8. uvicorn and aiohttp on the wheel-timed event loops",
    }
    for section, title in titles.items():
        sec = [d for d in figs if d["section"] == section]
        if not sec and section not in results["raw"]:
            continue
        lines += [f"## {title}", ""]
        lines += _section_notes(section, results)
        lines += [*figure_table(sec), ""]
        if out / f"{section}.png" in written:
            lines += [f"![{section}]({section}.png)", ""]
    lines += ["## Correctness checks", ""]
    lines += [f"- FAILED: {c}" for c in results["checks"]["failures"]]
    lines += [f"- ok: {c}" for c in results["checks"]["passed"]]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    (out / "summary.md").write_text(summary_markdown(results) + "\n")
    return written


def summary_markdown(results: dict[str, Any]) -> str:
    rows = [
        "| figure | peer | tickwheel | peer's | advantage, median (min-max) |",
        "|---|---|---:|---:|---:|",
    ]
    for d in summary_figures(results["figures"]):
        rows.append(
            f"| {d['name']} | {d['peer']} | {_raw(d['ours_median'], d['unit'])} | "
            f"{_raw(d['theirs_median'], d['unit'])} | {_ratio(d)} |"
        )
    m = results["machine"]
    rows += [
        "",
        f"{results['date']}, {results['repeats']} repeats: " + _machine_line(m) + ".",
    ]
    return "\n".join(rows)


def _section_notes(section: str, results: dict[str, Any]) -> list[str]:
    raw = results["raw"].get(section, {})
    plan = results["plan"]
    if section == "wheel":
        idle = raw.get("idle", {})
        notes = [
            "Per N: N far timers pending (1-2 h out) on each loop; schedule+cancel and "
            "reschedule are 1000 operations per round, fire is N timers due within 10 ms "
            "(bench/workloads/wheel_ops.py). Memory: bytes per pending timer in a fresh process "
            "(tracemalloc; RSS for uvloop). Lateness: p99 of `loop.time() - when` at firing "
            "of 10,000 timers 1-50 ms out with N far pending.",
            "",
            "Idle (0.5 s of `asyncio.sleep`), wheel wake-ups / loop `select` calls:",
            "",
        ]
        notes += [
            f"- {name}: {r['wakeups']} / {r['selects']}"
            for name, r in idle.items()
            if isinstance(r, dict)
        ]
        return [*notes, ""]
    if section == "server":
        rows = [
            f"{plan['server_conns']:,} connections on loopback, {plan['server_rounds']} "
            f"request rounds, idle timeout {plan['server_idle']:g} s; the server in its own "
            "process, the load generator in this one (bench/workloads/server_scenario.py).",
            "",
            "| server | CPU us/req | req/s | close late p50 | p99 | max | closed early |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for mode, s in raw.get("summary", {}).items():
            rows.append(
                f"| {mode} | {s['cpu_us_per_request']:.1f} | {s['requests_per_s']:,.0f} | "
                f"{s['close_late_p50_ms']:.0f} ms | {s['close_late_p99_ms']:.0f} ms | "
                f"{s['close_late_max_ms']:.0f} ms | {s['closed_early']} |"
            )
        return [*rows, ""]
    if section == "durable":
        rates = ", ".join(f"{r:,}" for r in plan["durable_rates"])
        notes = [
            f"{plan['durable_pending']:,} jobs pending on one private redis-server; "
            f"drain of {plan['durable_drain']:,} due jobs; lateness at {rates} jobs/s for "
            f"{plan['durable_seconds']:g} s each. Every peer is measured right after its "
            "own tickwheel run, in each repeat (bench/runner/durable.py says how each is "
            "measured, bench/peers/queues.py how each peer is set).",
            "",
        ]
        short = [
            (f"{run['peer']} at {rate} jobs/s", fired, plan["durable_seconds"] * int(rate))
            for run in raw.get("runs", [])
            for rate, fired in run[run["peer"]].get("lateness_fired", {}).items()
            if fired < plan["durable_seconds"] * int(rate)
        ]
        notes += [f"- {what}: only {got:,} of {n:,.0f} jobs ran in time" for what, got, n in short]
        notes += [
            f"- {run['peer']} at {rate} jobs/s: its scheduling ended {ms:,.0f} ms after the "
            "first job was due"
            for run in raw.get("runs", [])
            for rate, ms in run[run["peer"]].get("lateness_enqueue_late_ms", {}).items()
            if ms > 0
        ]
        kills = raw.get("kill", {})
        if kills:
            notes += [
                "",
                f"SIGKILL mid-run ({plan['durable_kill_jobs']:,} jobs due at once; a worker "
                "subprocess is killed once a third of them wrote their effect to a second "
                "Redis, then a fresh worker runs until the effects settle). A correctness "
                "row, not a speed one:",
                "",
                "| library | lost (no effect) | duplicated (effect > 1) | effects at kill "
                "| redelivery bound | settled after |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for lib, k in kills.items():
                err = " (worker failed: see results.json)" if "error" in k else ""
                notes.append(
                    f"| {lib}{err} | {k['lost']} | {k['duplicated']} | {k['effects_at_kill']} "
                    f"| {k['redeliver_s']:g} s | {k['settle_s']:.1f} s |"
                )
        return [*notes, ""]
    if section == "example":
        p = raw.get("peak")
        if not p:
            return []
        lat = p["lateness_ms"]
        return [
            f"{p['pending']:,} jobs pending in 16 shards; {p['peak_jobs']:,} of them due at "
            f"{plan['example_rate']:,}/s for {plan['example_seconds']:g} s, run by one "
            "Worker (LIMIT 500, poll 100 ms, lookahead 1 s) owning all 16 shards.",
            "",
            f"- lateness (ms): p50 {lat['p50']:.1f}, p99 {lat['p99']:.1f}, "
            f"p99.9 {lat['p999']:.1f}, max {lat['max']:.1f}, min {lat['min']:.2f}",
            f"- CPU per job: worker {p['worker_cpu_us_per_job']:.0f} us, redis-server "
            f"{p['redis_cpu_us_per_job']:.0f} us",
            f"- duplicates {p['duplicates']}, loader counters {p['stats']}",
            "- the document's peak per shard is 2,900 / 16 = ~180 jobs/s; its claim "
            "capacity 5,000/s per shard (LIMIT 500 every 100 ms)",
            "",
        ]
    if section == "postgres":
        return _postgres_notes(raw)
    if section == "loop":
        from bench.runner.loop import notes

        return notes(raw, plan)
    if section == "brokers":
        return _brokers_notes(raw)
    if section == "limits":
        return _limits_notes(raw)
    return []


def _brokers_notes(raw: dict[str, Any]) -> list[str]:
    """The brokers section's lateness runs, one row per broker, rate and repeat."""
    late = raw.get("lateness")
    if not late:
        return [f"Peer: {raw.get('peer')}.", ""] if raw.get("peer") else []
    notes = [
        f"Peer: {raw.get('peer')}. Lateness: consume start minus nominal due, jobs due at "
        "a steady rate, publisher and consumer in one process:",
        "",
        "| broker | jobs/s due | jobs | p50 ms | p99 ms | missing | early | twice |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in late:
        notes.append(
            f"| {g['broker']} | {g['rate']:,} | {g['jobs']:,} | {g['p50_ms']:.1f} "
            f"| {g['p99_ms']:.1f} | {g['missing']} | {g['early']} | {g['twice']} |"
        )
    return [*notes, ""]


def _limits_notes(raw: dict[str, Any]) -> list[str]:
    """The flow limits' raw figures, one row per repeat (bench/runner/limits.py)."""
    reps, size = raw.get("repeats"), raw.get("sizes", {})
    if not reps:
        return []
    notes = [
        f"One private redis-server, one Worker. claim+run+ack: {size['jobs']:,} jobs over "
        f"{size['jobs'] // 10:,} keys (10 a key; 5 a key: over {size['jobs'] // 5:,}); "
        f"release: {size['release']} jobs of one key at "
        f"concurrency=1; memory (MEMORY USAGE of the namespace's keys): {size['memory']:,} "
        f"jobs waiting for one key's permit, then over {size['memory'] // 40:,} keys; "
        f"rate: {size['rate']} jobs of one "
        f"key at rate=(10, 1.0). Peer: {raw.get('peer')} (drainDelay 1 s: "
        "bench/peers/bullmq_limiter.py says why). Most starts in 1 s: by the handlers' "
        "clock (a start lags its grant by a few ms); surely: grants surely in one window.",
        "",
        "| repeat | jobs/s off | on | 5 a key: off | on | release p50 ms | p99 | max "
        "| B pending | B waiting "
        "| rate: last start s | most in 1 s | surely | bullmq: last start s | most in 1 s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in reps:
        rel, rate, bull = g["release_ms"], g["rate"], g.get("bullmq", {})
        notes.append(
            f"| {g['repeat'] + 1} | {g['jobs_per_s_off']:,.0f} | {g['jobs_per_s_on']:,.0f} "
            f"| {g['jobs_per_s_off_5']:,.0f} | {g['jobs_per_s_on_5']:,.0f} "
            f"| {rel['p50']:.1f} | {rel['p99']:.1f} | {rel['max']:.1f} "
            f"| {g['memory_pending_b']:.0f} | {g['memory_waiting_b']:.0f} "
            f"| {rate['last_start_s']:.2f} | {rate['most_in_1s_by_start']} "
            f"| {rate['surely_in_1s']} | {_num(bull.get('last_start_s'))} "
            f"| {bull.get('most_in_1s_by_start', '-')} |"
        )
    return [*notes, ""]


def _postgres_notes(raw: dict[str, Any]) -> list[str]:
    """The Postgres section's lateness run and its cost against the Redis-only mode."""
    late, rounds = raw.get("lateness"), raw.get("rounds")
    if not late or not rounds:
        return []
    notes = [
        "Firing lateness, jobs due at a steady rate in 4 shards, one Worker (lookahead "
        "0.5 s, poll 50 ms), each mode on the same servers; end to end: jobs over the time "
        "from the first due time to the last run:",
        "",
        "| mode | jobs/s due | jobs | p50 ms | p99 ms | max ms | end to end, jobs/s "
        "| ran | duplicates | early |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in late:
        lat = run["lateness_ms"]
        notes.append(
            f"| {run['mode']} | {run['rate']:,} | {run['jobs']:,} | {lat.get('p50', 0):.1f} "
            f"| {lat.get('p99', 0):.1f} | {lat.get('max', 0):.1f} | {run['end_to_end']:,.0f} "
            f"| {run['ran']:,} | {run['duplicates']} | {run['early']} |"
        )
    notes += [
        "",
        "The cost of the source of truth: the Postgres mode over the Redis-only mode, "
        f"same servers, {raw.get('jobs', 0):,} jobs per figure (medians, us/job):",
        "",
        "| figure | Redis only | Postgres mode | cost |",
        "|---|---:|---:|---:|",
    ]
    for name, values in rounds["redis"].items():
        a = statistics.median(values)
        b = statistics.median(rounds["postgres"][name])
        notes.append(f"| {name} | {a:.1f} | {b:.1f} | {b / a:.2f}x |")
    return [*notes, ""]


def plots(out: Path, results: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    figs = results["figures"]
    for section in ("wheel", "server", "durable", "example", "postgres", "limits", "loop"):
        sec = [d for d in figs if d["section"] == section]
        if sec:
            path = out / f"{section}.png"
            _bars(plt, sec, f"tickwheel's advantage: {section}", path)
            written.append(path)
    summ = summary_figures(figs)
    if summ:
        path = out / "summary.png"
        _bars(plt, summ, "tickwheel vs peers (above 1: tickwheel better)", path)
        written.append(path)
    return written


def _bars(plt: Any, figs: list[dict[str, Any]], title: str, path: Path) -> None:
    labels = [f"{d['name']}\nvs {d['peer']}" for d in figs]
    med = [d["ratio_median"] or 0.0 for d in figs]
    lo = [m - (d["ratio_min"] or m) for m, d in zip(med, figs, strict=True)]
    hi = [(d["ratio_max"] or m) - m for m, d in zip(med, figs, strict=True)]
    height = max(3.0, 0.42 * len(figs) + 1.2)
    fig, ax = plt.subplots(figsize=(9, height))
    y = range(len(figs))
    colors = ["tab:green" if m >= 1 else "tab:red" for m in med]
    ax.barh(list(y), med, xerr=[lo, hi], color=colors, alpha=0.8, capsize=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ratio, median of repeats (bars: min-max); log scale")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
