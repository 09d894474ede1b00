"""Figures of one configuration (one JSON object), and the readable tables of a whole run."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from runtime.bench.grid import Config
from runtime.bench.loop import Outcome, Rollout
from runtime.bench.meter import MB
from runtime.profiling.estimators import percentile


@dataclass
class Usage:
    """What the meter saw over the measured window."""

    cpu_s: dict[str, float]
    """CPU seconds per process spent inside the window."""
    machine_cpu_s: float
    """CPU seconds the whole machine spent inside the window (others' processes included)."""
    peak_rss: dict[str, int]
    """Peak resident bytes per process over the configuration's life."""
    worker_rss_idle: int
    """Workers' resident bytes, summed, just before the load."""
    worker_rss_loaded: int
    """Workers' resident bytes, summed, at their sampled peak during the load."""


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (`runtime.profiling.estimators.percentile`); 0.0 for no values."""
    return percentile(values, q) if values else 0.0


def _ms(x: float) -> float:
    return round(x * 1000, 3)


def hop_parts(r: Rollout) -> dict[str, float]:
    """Per-hop seconds of one rollout: overhead (e2e minus model, tool and verify time), and its parts."""
    assert r.result is not None
    t = r.result.timings
    hops = max(1, t.hops)
    work = t.model_s + t.tool_s + t.verify_s
    return {
        "overhead": (r.e2e_s - work) / hops,
        "overhead_with_verify": (r.e2e_s - t.model_s - t.tool_s) / hops,
        "queue": t.queue_s / hops,
        "in_handler": (t.handler_s - work) / hops,
    }


def figures(c: Config, out: Outcome, usage: Usage, submitted: int) -> dict[str, Any]:
    """The JSON line of one configuration."""
    window = max(1e-9, out.window_end - out.window_start)
    measured = [r for r in out.in_window() if r.result is not None and not r.result.failed]
    results = [r.result for r in measured if r.result is not None]
    parts = [hop_parts(r) for r in measured]
    stack_cpu = sum(v for k, v in usage.cpu_s.items() if k != "driver")
    rps = len(measured) / window
    ideal = c.ideal_rps
    failed = sum(1 for r in out.completed if r.result is not None and r.result.failed)
    return {
        "workload": c.workload,
        "latency_ms": c.latency_ms,
        "concurrency": c.concurrency,
        "replicas": c.replicas,
        "submitted": submitted,
        "completed": len(out.completed),
        "stored": out.stored,
        "failed": failed,
        "lost": submitted - out.stored,
        "hit_time_bound": out.hit_time_bound,
        "window_s": round(window, 3),
        "measured": len(measured),
        "rollouts_per_s": round(rps, 2),
        "agent_steps_per_s": round(sum(x.timings.model_calls for x in results) / window, 2),
        "e2e_ms_p50": _ms(pct([r.e2e_s for r in measured], 50)),
        "e2e_ms_p99": _ms(pct([r.e2e_s for r in measured], 99)),
        "overhead_per_hop_ms_p50": _ms(pct([p["overhead"] for p in parts], 50)),
        "overhead_per_hop_ms_p99": _ms(pct([p["overhead"] for p in parts], 99)),
        "overhead_with_verify_per_hop_ms_p50": _ms(pct([p["overhead_with_verify"] for p in parts], 50)),
        "overhead_with_verify_per_hop_ms_p99": _ms(pct([p["overhead_with_verify"] for p in parts], 99)),
        "queue_per_hop_ms_p50": _ms(pct([p["queue"] for p in parts], 50)),
        "in_handler_per_hop_ms_p50": _ms(pct([p["in_handler"] for p in parts], 50)),
        "model_call_ms_p50": _ms(pct([x.timings.model_s / max(1, x.timings.model_calls) for x in results], 50)),
        "verify_ms_p50": _ms(pct([x.timings.verify_s for x in results], 50)),
        "cpu_s_per_rollout": round(stack_cpu / max(1, len(measured)), 5),
        "cpu_cores": round(stack_cpu / window, 3),
        "other_cores": round(max(0.0, usage.machine_cpu_s - sum(usage.cpu_s.values())) / window, 3),
        "cpu_s_per_rollout_by_process": {k: round(v / max(1, len(measured)), 5) for k, v in usage.cpu_s.items()},
        "peak_rss_mb": {k: round(v / MB, 1) for k, v in usage.peak_rss.items()},
        "stack_peak_rss_mb": round(sum(v for k, v in usage.peak_rss.items() if k != "driver") / MB, 1),
        "worker_kb_per_inflight": round(
            max(0, usage.worker_rss_loaded - usage.worker_rss_idle) / 1024 / c.concurrency, 2
        ),
        "ideal_rollouts_per_s": round(ideal, 2) if ideal else None,
        "ideal_ratio": round(rps / ideal, 3) if ideal else None,
    }


def ok(f: dict[str, Any]) -> bool:
    """Every submitted rollout ended as a stored, successful Result."""
    return f["lost"] == 0 and f["failed"] == 0 and f["completed"] == f["submitted"]


COLUMNS = [
    ("workload", "workload", "{}"),
    ("L ms", "latency_ms", "{:g}"),
    ("C", "concurrency", "{}"),
    ("W", "replicas", "{}"),
    ("rollouts/s", "rollouts_per_s", "{:.1f}"),
    ("steps/s", "agent_steps_per_s", "{:.1f}"),
    ("e2e p50 ms", "e2e_ms_p50", "{:.1f}"),
    ("e2e p99 ms", "e2e_ms_p99", "{:.1f}"),
    ("ovh/hop p50", "overhead_per_hop_ms_p50", "{:.2f}"),
    ("ovh/hop p99", "overhead_per_hop_ms_p99", "{:.2f}"),
    ("CPU ms/rollout", "cpu_s_per_rollout", "{:.2f}"),
    ("cores", "cpu_cores", "{:.2f}"),
    ("others' cores", "other_cores", "{:.2f}"),
    ("stack peak MB", "stack_peak_rss_mb", "{:.0f}"),
    ("KB/in-flight", "worker_kb_per_inflight", "{:.1f}"),
    ("of ideal", "ideal_ratio", "{:.0%}"),
    ("done", None, ""),
]


def _cell(f: dict[str, Any], key: str | None, fmt: str) -> str:
    if key is None:
        return f"{f['stored']}/{f['submitted']}" + (f" ({f['failed']} failed)" if f["failed"] else "")
    value = f.get(key)
    if key == "cpu_s_per_rollout" and value is not None:
        value = value * 1000
    return "-" if value is None else fmt.format(value)


def table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for name, _, _ in COLUMNS:
        t.add_column(name, justify="left" if name == "workload" else "right")
    for f in rows:
        t.add_row(*(_cell(f, key, fmt) for _, key, fmt in COLUMNS))
    return t


def scaling(rows: list[dict[str, Any]]) -> Table | None:
    """Throughput against replicas W, for each (workload, L, C) measured at more than one W."""
    curves: dict[tuple[str, float, int], dict[int, float]] = defaultdict(dict)
    for f in rows:
        curves[(f["workload"], f["latency_ms"], f["concurrency"])][f["replicas"]] = f["rollouts_per_s"]
    ws = sorted({f["replicas"] for f in rows})
    if len(ws) < 2:
        return None
    t = Table(title="scaling: rollouts/s against W (worker processes per function)")
    for name in ("workload", "L ms", "C", *(f"W={w}" for w in ws), f"W={ws[-1]} / W={ws[0]}"):
        t.add_column(name, justify="right")
    for (workload, lat, c), by_w in curves.items():
        base, top = by_w.get(ws[0]), by_w.get(ws[-1])
        ratio = f"{top / base:.2f}x" if base and top else "-"
        t.add_row(workload, f"{lat:g}", str(c), *(f"{by_w[w]:.1f}" if w in by_w else "-" for w in ws), ratio)
    return t
