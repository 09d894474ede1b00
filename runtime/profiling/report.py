"""``report.html``: one self-contained page per run (inline CSS, JS, SVG and data; opens with no network).

It shows the profile's numbers, five charts (reward histogram, pass@k and majority@k over k, tasks by
pass rate, latency CDF per hop, failures by kind), the tasks hardest first, and a rollout browser
that shows any rollout's conversation (messages, tool calls, tool outputs), reward and verifier info.

Other files of the run folder add sections through `section_providers` (one function each, taking
the run folder and returning a `Section` or None): that is where a per-hop breakdown read from
``traces.jsonl`` plugs in.
"""

from __future__ import annotations

import heapq
import json
from array import array
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from runtime.items import reasoning_text
from runtime.profiling import charts, profile, runfolder
from runtime.profiling.profile import HOPS, Profile, SampleTable, TaskProfile
from runtime.profiling.tables import seconds

MAX_ROLLOUTS = 3000
"""Rollouts the browser embeds (failed ones first, then in task order); all are in rollouts.jsonl."""
MAX_TRACES = 2_000
"""The trace section reads this many traces at most: a per-hop breakdown does not need every rollout's."""
MAX_TEXT = 20_000
"""Characters kept of one conversation item."""


@dataclass(frozen=True)
class Section:
    """An extra part of the report, from another file of the run folder."""

    id: str
    title: str
    html: Markup
    """Trusted HTML (build it with markupsafe or a template; charts.* output is safe)."""


SectionProvider = Callable[[Path], Section | None]


def section_providers() -> list[SectionProvider]:
    """Extra sections, in page order."""
    return [trace_section]


def trace_section(run_dir: Path) -> Section | None:
    """The per-hop latency breakdown of the run's ``traces.jsonl`` (what `gymbus traces` prints), if any."""
    from runtime.profiling import breakdown as traces
    from runtime.telemetry.spanfile import iter_spans

    path = run_dir / "traces.jsonl"
    if not path.is_file():
        return None
    rollouts = traces.rollouts(iter_spans(path, max_traces=MAX_TRACES))
    if not rollouts:
        return None
    head = "".join(f"<th>{h}</th>" for h in ("hop", "count", "per rollout", "mean", "p50", "p95", "max", "share"))
    body = Markup("").join(_hop_row(r) for r in traces.breakdown(rollouts))
    note = Markup(
        "<p>From the spans of {} rollouts in <code>traces.jsonl</code>{}; "
        "<code>gymbus traces</code> prints the slowest as waterfalls.</p>"
    ).format(len(rollouts), f" (the first {MAX_TRACES:,} traces in the file)" if len(rollouts) >= MAX_TRACES else "")
    table = Markup('<table class="tasks"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>').format(
        Markup(head), Markup(body)
    )
    return Section(id="traces", title="Where the time went (traces)", html=note + table)


def _hop_row(r: Any) -> Markup:
    times = Markup("").join(
        Markup("<td>{}</td>").format(seconds(v)) for v in (r.per_rollout_s, r.mean_s, r.p50_s, r.p95_s, r.max_s)
    )
    return Markup("<tr><td>{}</td><td>{}</td>{}<td>{:.0%}</td></tr>").format(r.hop, r.count, times, r.share)


def write_all(run_dir: Path, pass_threshold: float | None = None) -> Profile:
    """Profile a run folder and write ``profile.json``, ``tasks.jsonl`` and ``report.html`` into it."""
    rows = RowView()
    info, samples = runfolder.load(run_dir, pass_threshold, on_row=rows.add)
    prof, tasks = profile.build(info, samples, source="offline")
    runfolder.write(run_dir, prof, tasks)
    meta_path = run_dir / "metadata.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    sections = [s for p in section_providers() if (s := p(run_dir)) is not None]
    (run_dir / "report.html").write_text(render(prof, tasks, rows, samples, meta, sections))
    return prof


def render(
    prof: Profile,
    tasks: list[TaskProfile],
    rows: RowView,
    samples: SampleTable,
    meta: dict[str, Any],
    sections: list[Section] | None = None,
) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True, undefined=jinja2.StrictUndefined
    )
    rollouts, total = browser_rows(rows.kept(), prof.pass_threshold), rows.total
    return env.get_template("report.html").render(
        p=prof,
        meta=meta,
        config=meta.get("config") or {},
        charts=_charts(prof, tasks, samples),
        hardest=sorted((t for t in tasks if t.scored), key=lambda t: (t.pass_rate or 0.0, t.task_index)),
        unscored=[t for t in tasks if not t.scored],
        prompts=rows.prompts,
        answers=rows.answers,
        rollouts=rollouts,
        total_rollouts=total,
        sections=sections or [],
        seconds=seconds,
        hops=HOPS,
        version=_version(),
    )


# --- charts ------------------------------------------------------------------------------------


def _charts(prof: Profile, tasks: list[TaskProfile], samples: SampleTable) -> dict[str, Markup]:
    rewards: array[float] = array("d")
    hops: dict[str, array[float]] = {h: array("d") for h in HOPS}
    for s in samples:  # one pass: the table builds each Sample as it is read
        if s.reward is not None:
            rewards.append(s.reward)
        for hop, v in profile.hop_seconds(s).items():
            hops[hop].append(v)
    out = {
        "reward": Markup(_reward_histogram(rewards)),
        "pass_at_k": Markup(_pass_at_k(prof)),
        "difficulty": Markup(_difficulty(tasks)),
        "latency": Markup(charts.cdf("latency", hops, x_title="seconds per rollout (log scale)", fmt=_short_seconds)),
    }
    if prof.failures:
        labels = list(prof.failures)
        out["failures"] = Markup(
            charts.hbars("failures", labels, [prof.failures[k] for k in labels], x_title="failed rollouts")
        )
    return out


def _reward_histogram(rewards: Sequence[float]) -> str:
    distinct = sorted(set(rewards))
    if len(distinct) <= 11:
        counts = Counter(rewards)
        labels = [f"{v:g}" for v in distinct]
        values = [float(counts[v]) for v in distinct]
    else:
        lo, hi = min(rewards), max(rewards)
        width = (hi - lo) / 10
        bins = [0.0] * 10
        for r in rewards:
            bins[min(9, int((r - lo) / width))] += 1
        labels = [f"{lo + i * width:.2g}" for i in range(10)]
        values = bins
    return charts.columns("reward", labels, values, x_title="reward", y_title="rollouts")


def _pass_at_k(prof: Profile) -> str:
    series = [charts.Series("pass@k", [(v.k, v.value) for v in prof.pass_at_k], charts.PALETTE[0])]
    if prof.majority_at_k:
        series.append(charts.Series("majority@k", [(v.k, v.value) for v in prof.majority_at_k], charts.PALETTE[1]))
    ticks = [(float(v.k), str(v.k)) for v in prof.pass_at_k]
    return charts.lines("pass_at_k", series, x_ticks=ticks, x_title="k (samples per task)", y_title="share of tasks")


def _difficulty(tasks: list[TaskProfile]) -> str:
    rated = [t for t in tasks if t.scored]
    sizes = {t.scored for t in rated}
    if len(sizes) == 1 and (n := sizes.pop()) <= 16:
        counts = Counter(t.passed for t in rated)
        labels = [f"{c}/{n}" for c in range(n + 1)]
        values = [float(counts[c]) for c in range(n + 1)]
    else:
        bins = [0.0] * 10
        for t in rated:
            bins[min(9, int((t.pass_rate or 0.0) * 10))] += 1
        labels = [f"{10 * i}%" for i in range(10)]
        values = bins
    tips = [f"{v:g} tasks passed {label}" for label, v in zip(labels, values, strict=True)]
    return charts.columns(
        "difficulty",
        labels,
        values,
        x_title="rollouts passed per task",
        y_title="tasks",
        color=charts.PALETTE[2],
        tips=tips,
    )


def _short_seconds(v: float) -> str:
    if v < 1:
        return f"{v * 1000:g} ms"
    if v < 1000:
        return f"{v:g} s"
    return f"{v / 3600:.3g} h"


# --- the rollout browser -------------------------------------------------------------------------


class RowView:
    """What the report shows of ``rollouts.jsonl``, gathered one row at a time so a run of any size is
    never held: each task's prompt preview and expected answer, and the rollouts the browser lists
    (up to ``limit``: failed ones first, then by task and repeat)."""

    def __init__(self, limit: int = MAX_ROLLOUTS) -> None:
        self.limit = limit
        self.total = 0
        self.prompts: dict[int, str] = {}
        self.answers: dict[int, Any] = {}
        self._kept: list[tuple[tuple[bool, int, int], int, dict[str, Any]]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.total += 1
        task = row.get("task_index", -1)
        if task not in self.prompts:
            self.prompts[task], self.answers[task] = _preview(row), row.get("expected_answer")
        key = (row.get("reward") is not None, row.get("task_index", 0), row.get("rollout_index", 0))
        self._kept.append((key, self.total, row))
        if len(self._kept) >= 2 * self.limit:
            self._kept = heapq.nsmallest(self.limit, self._kept)

    def kept(self) -> list[dict[str, Any]]:
        return [row for _, _, row in heapq.nsmallest(self.limit, self._kept)]


def browser_rows(rows: list[dict[str, Any]], threshold: float) -> list[dict[str, Any]]:
    """What the browser shows of each of ``rows``, by task and repeat."""
    kept = sorted(rows, key=lambda r: (r.get("task_index", 0), r.get("rollout_index", 0)))
    return [_rollout(r, threshold) for r in kept]


def _rollout(row: dict[str, Any], threshold: float) -> dict[str, Any]:
    reward = row.get("reward")
    timings = row.get("timings") or {}
    return {
        "sid": row.get("session_id"),
        "task": row.get("task_index"),
        "rollout": row.get("rollout_index"),
        "attempt": row.get("attempt", 0),
        "reward": reward,
        "passed": None if reward is None else reward >= threshold,
        "failure_kind": row.get("failure_kind"),
        "failure_reason": row.get("failure_reason"),
        "verifier": row.get("verifier") or {},
        "expected": row.get("expected_answer"),
        "usage": (row.get("response") or {}).get("usage") or {},
        "timings": {k: timings[k] for k in ("total_s", "queue_s", "model_s", "tool_s", "verify_s") if k in timings},
        "calls": {k: timings[k] for k in ("hops", "model_calls", "tool_calls") if k in timings},
        "items": conversation(row),
    }


def conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A rollout's conversation as display items: the task's input, then everything the rollout produced."""
    params = row.get("responses_create_params") or {}
    items: list[Any] = []
    if isinstance(params.get("instructions"), str):
        items.append({"type": "message", "role": "system", "content": params["instructions"]})
    given = params.get("input")
    if isinstance(given, str):
        items.append({"type": "message", "role": "user", "content": given})
    elif isinstance(given, list):
        items += given
    elif given is not None:  # not valid input (the rollout failed on it): shown as it is
        items.append(given)
    items += (row.get("response") or {}).get("output") or []
    return [_item(i) for i in items]


def _item(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        return {"kind": "other", "text": _clip(json.dumps(item))}
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        return {
            "kind": "message",
            "role": str(item.get("role", "?")),
            "text": _clip(_content_text(item.get("content"))),
        }
    if kind == "function_call":
        return {
            "kind": "call",
            "name": str(item.get("name", "?")),
            "call_id": item.get("call_id"),
            "text": _clip(_pretty_json(item.get("arguments", ""))),
        }
    if kind == "function_call_output":
        return {"kind": "output", "call_id": item.get("call_id"), "text": _clip(_content_text(item.get("output")))}
    if kind == "reasoning":
        return {"kind": "reasoning", "text": _clip(reasoning_text(item))}
    return {"kind": "other", "text": _clip(json.dumps(item, indent=1))}


def _content_text(content: Any) -> str:
    """A content for the rollout browser: its text parts, and a placeholder for each part that is not
    text (an image, a file), so the reader sees they were there (`runtime.items.text_of` drops them)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                parts.append(f"[{p.get('type', 'part') if isinstance(p, dict) else 'part'}]")
        return "\n".join(parts)
    return "" if content is None else json.dumps(content)


def _pretty_json(raw: Any) -> str:
    try:
        return json.dumps(json.loads(raw), indent=1) if isinstance(raw, str) else json.dumps(raw, indent=1)
    except json.JSONDecodeError:
        return str(raw)


def _clip(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"\n… ({len(text) - MAX_TEXT:,} more characters in rollouts.jsonl)"


def _preview(row: dict[str, Any]) -> str:
    users = [
        i["text"]
        for i in conversation({"responses_create_params": row.get("responses_create_params")})
        if i.get("role") == "user"
    ]
    text = " ".join((users[-1] if users else "").split())
    return text if len(text) <= 160 else text[:157] + "…"


def _version() -> str:
    try:
        return version("gymbus")
    except PackageNotFoundError:
        return "dev"
