"""Where a run's time went, from its ``traces.jsonl``: per-hop latency, and single rollouts as waterfalls.

    from runtime.profiling import breakdown as traces
    rows = traces.breakdown_of("runs/<run_id>/traces.jsonl")      # list[HopStats], for reports

A hop is a kind of span (see `hop_of`): the rollout itself, the waits in the stream, each
function's step (a CONSUMER span), and inside the steps the model calls, tool calls, verification
and publishes. Steps contain their inner hops, so shares of the rollout time overlap by design.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from runtime.profiling.estimators import percentile
from runtime.telemetry import semconv
from runtime.telemetry.spanfile import SpanRecord, load

HOPS = (
    "rollout",
    "queue: agent",
    "queue: tool",
    "queue: verify",
    "agent step",
    "model call",
    "tool step",
    "tool call",
    "verify step",
    "verify",
    "publish",
)
"""Breakdown rows, in order."""
_INNER = {"model call", "tool call", "verify", "publish"}
_STYLE = {"queue": "yellow", "model call": "magenta", "tool call": "cyan", "verify": "green", "publish": "blue"}


@dataclass
class Rollout:
    """One trace: a rollout's spans, its root first."""

    trace_id: str
    spans: list[SpanRecord]
    children: dict[str | None, list[SpanRecord]] = field(default_factory=dict)

    @property
    def root(self) -> SpanRecord:
        return self.spans[0]

    @property
    def start_ns(self) -> int:
        return min(s.start_ns for s in self.spans)

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.spans)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def session_id(self) -> str:
        for s in self.spans:
            sid = s.attributes.get(semconv.GEN_AI_CONVERSATION_ID) or s.attributes.get(
                semconv.MESSAGING_MESSAGE_CONVERSATION_ID
            )
            if sid:
                return str(sid)
        return self.trace_id


@dataclass
class HopStats:
    """Latency of one kind of hop over a run's rollouts (seconds)."""

    hop: str
    count: int
    total_s: float
    mean_s: float
    p50_s: float
    p95_s: float
    max_s: float
    per_rollout_s: float
    """Total time in this hop divided by the number of rollouts."""
    share: float
    """Total time in this hop over the rollouts' total time (steps include their inner hops)."""


def _role(subject: str) -> str:
    parts = subject.split(".")
    return parts[1] if len(parts) > 2 else subject


def hop_of(span: SpanRecord) -> str | None:
    """The breakdown row a span counts in, or None (HTTP client/server spans and the like)."""
    name, kind = span.name, span.kind
    if name.startswith(semconv.INVOKE_AGENT + " "):
        return "rollout"
    if name.startswith(semconv.QUEUE + " "):
        return f"queue: {_role(name.split(' ', 1)[1])}"
    if kind == "consumer" and name.startswith(semconv.PROCESS + " "):
        return f"{_role(name.split(' ', 1)[1])} step"
    operation = span.attributes.get(semconv.GEN_AI_OPERATION_NAME)
    if operation == semconv.CHAT:
        return "model call"
    if operation == semconv.EXECUTE_TOOL:
        return "tool call"
    if name.startswith(semconv.VERIFY + " "):
        return "verify"
    if kind == "producer" and name.startswith(semconv.SEND + " "):
        return "publish"
    return None


def queued(span: SpanRecord) -> SpanRecord | None:
    """A hop's wait in the stream (its ``gymbus.queue.wait_s``) as a span ending where the hop starts."""
    wait = span.attributes.get(semconv.QUEUE_WAIT)
    if span.kind != "consumer" or not isinstance(wait, (int, float)):
        return None
    return SpanRecord(
        trace_id=span.trace_id,
        span_id=span.span_id + "q",
        parent_id=span.parent_id,
        name=f"{semconv.QUEUE} {span.name.split(' ', 1)[-1]}",
        kind="internal",
        start_ns=span.start_ns - int(wait * 1e9),
        end_ns=span.start_ns,
        service=span.service,
    )


def rollouts(spans: Iterable[SpanRecord]) -> list[Rollout]:
    """Spans grouped by trace, each with its root first (the rollout span, else the earliest top span).
    Each hop's wait in the stream is added as a ``queue`` span (see `queued`). Traces that are not
    rollouts (no rollout span, no hop: e.g. a lone request to the model server) are left out."""
    by_trace: dict[str, list[SpanRecord]] = defaultdict(list)
    for s in spans:
        by_trace[s.trace_id].append(s)
        wait = queued(s)
        if wait is not None:
            by_trace[s.trace_id].append(wait)
    out = []
    for trace_id, group in by_trace.items():
        ids = {s.span_id for s in group}
        tops = sorted((s for s in group if s.parent_id not in ids), key=lambda s: (hop_of(s) != "rollout", s.start_ns))
        rest = sorted((s for s in group if s.parent_id in ids), key=lambda s: s.start_ns)
        if not any(hop_of(s) == "rollout" or s.kind == "consumer" for s in tops):
            continue
        r = Rollout(trace_id, tops + rest)
        for s in rest:
            r.children.setdefault(s.parent_id, []).append(s)
        r.children[None] = tops
        out.append(r)
    return out


def breakdown(traces: list[Rollout]) -> list[HopStats]:
    """Per-hop latency over the rollouts, in `HOPS` order (rows with no span are left out)."""
    durations: dict[str, list[float]] = defaultdict(list)
    for r in traces:
        for s in r.spans:
            hop = hop_of(s)
            if hop is not None:
                durations[hop].append(s.duration_s)
    total = sum(r.duration_s for r in traces) or 1.0
    rows = []
    for hop in HOPS:
        values = sorted(durations.get(hop, []))
        if not values:
            continue
        spent = sum(values)
        rows.append(
            HopStats(
                hop=hop,
                count=len(values),
                total_s=spent,
                mean_s=spent / len(values),
                p50_s=percentile(values, 50),
                p95_s=percentile(values, 95),
                max_s=values[-1],
                per_rollout_s=spent / max(1, len(traces)),
                share=spent / total,
            )
        )
    return rows


def breakdown_of(path: str | Path) -> list[HopStats]:
    """`breakdown` of a ``traces.jsonl`` file (or a run folder holding one)."""
    p = Path(path)
    return breakdown(rollouts(load(p / "traces.jsonl" if p.is_dir() else p)))


def slowest(traces: list[Rollout], n: int) -> list[Rollout]:
    return sorted(traces, key=lambda r: r.duration_s, reverse=True)[:n]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def breakdown_table(rows: list[HopStats], n_rollouts: int) -> Table:
    table = Table(title=f"per-hop latency over {n_rollouts} rollouts (ms)", title_justify="left")
    table.add_column("hop")
    for name in ("count", "per rollout", "mean", "p50", "p95", "max", "share"):
        table.add_column(name, justify="right")
    for r in rows:
        label = ("    " if r.hop in _INNER else "  " if r.hop != "rollout" else "") + r.hop
        table.add_row(
            label,
            str(r.count),
            _ms(r.per_rollout_s),
            _ms(r.mean_s),
            _ms(r.p50_s),
            _ms(r.p95_s),
            _ms(r.max_s),
            f"{r.share:.0%}",
        )
    return table


def _tree(r: Rollout) -> list[tuple[SpanRecord, str]]:
    """Spans in depth-first order with their tree-drawing prefix."""
    out: list[tuple[SpanRecord, str]] = []

    def walk(parent: str | None, prefix: str) -> None:
        kids = r.children.get(parent, [])
        for i, s in enumerate(kids):
            last = i == len(kids) - 1
            out.append((s, prefix + ("└ " if last else "├ ") if parent is not None else ""))
            walk(s.span_id, prefix + ("  " if last else "│ ") if parent is not None else "")

    walk(None, "")
    return out


def _bar(s: SpanRecord, t0: int, scale: float, width: int) -> Text:
    first = min(width - 1, int((s.start_ns - t0) * scale))
    last = max(first + 1, min(width, round((s.end_ns - t0) * scale)))
    hop = hop_of(s) or ""
    style = _STYLE.get(hop.split(":")[0], "white") if s.status != "error" else "red"
    return Text(" " * first + "█" * (last - first), style=style)


def waterfall(r: Rollout, width: int = 48) -> Group:
    """One rollout's span tree against a shared time axis."""
    t0, total = r.start_ns, max(1, r.end_ns - r.start_ns)
    root = r.root
    reward = root.attributes.get(semconv.REWARD)
    failure = root.attributes.get(semconv.ERROR_TYPE)
    outcome = f"failed: {failure}" if failure else f"reward {reward}" if reward is not None else ""
    title = Text.assemble(
        ("rollout ", "bold"), (r.session_id, "bold cyan"), f"  {_ms(r.duration_s)} ms  {outcome}  trace {r.trace_id}"
    )
    table = Table(box=None, pad_edge=False, show_header=True, header_style="dim")
    table.add_column("span", no_wrap=True)
    table.add_column("service", style="dim", no_wrap=True)
    table.add_column("at ms", justify="right")
    table.add_column("ms", justify="right")
    table.add_column("timeline", no_wrap=True, min_width=width)
    for s, prefix in _tree(r):
        table.add_row(
            Text(prefix, style="dim") + Text(s.name, style="red" if s.status == "error" else ""),
            s.service.removeprefix("gymbus-"),
            _ms((s.start_ns - t0) / 1e9),
            _ms(s.duration_s),
            _bar(s, t0, width / total, width),
        )
    return Group(title, table)


def as_json(traces: list[Rollout], n: int) -> dict[str, Any]:
    """The breakdown and the slowest rollouts' spans, for machines."""
    return {
        "rollouts": len(traces),
        "breakdown": [asdict(row) for row in breakdown(traces)],
        "slowest": [
            {
                "trace_id": r.trace_id,
                "session_id": r.session_id,
                "duration_s": r.duration_s,
                "spans": [
                    {
                        "name": s.name,
                        "span_id": s.span_id,
                        "parent_id": s.parent_id,
                        "service": s.service,
                        "start_s": (s.start_ns - r.start_ns) / 1e9,
                        "duration_s": s.duration_s,
                        "status": s.status,
                    }
                    for s, _ in _tree(r)
                ],
            }
            for r in slowest(traces, n)
        ],
    }
