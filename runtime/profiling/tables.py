"""Terminal views of profiles and run status (rich renderables)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from runtime.profiling.estimators import Spread
from runtime.profiling.profile import HOPS, AtK, Profile


def num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}".rstrip("0").rstrip(".") if x != int(x) else str(int(x))


def seconds(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 0.001:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1000:.1f} ms"
    return f"{x:.2f} s"


def at_k(values: list[AtK]) -> str:
    return "  ".join(f"@{v.k} {v.value:.3f}" for v in values) or "-"


def profile_table(p: Profile) -> Group:
    """The profile at a glance: completion, rewards, failures, pass@k, throughput; then latency by hop."""
    summary = Table(title=f"profile of run {p.run_id} ({p.source})", show_header=False, box=None, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    expected = f"{p.present} / {p.expected}" if p.expected else f"{p.present}"
    completion = f" ({p.completion:.0%})" if p.completion is not None else ""
    shape = f" · {p.tasks} tasks × {p.repeats}" if p.repeats else f" · {p.tasks} tasks"
    summary.add_row("rollouts", f"{expected}{completion}{shape}")
    r = p.reward
    summary.add_row(
        "reward",
        f"mean {num(r.mean)} ± {num(r.std)} · median {num(r.median)} · min {num(r.min)} · max {num(r.max)}"
        f"  (over {p.scored} scored)"
        if r.count
        else "- (nothing scored yet)",
    )
    failures = " · ".join(f"{k} {v}" for k, v in p.failures.items())
    summary.add_row("failed", Text(f"{p.failed}  ({failures}; not scored)", style="red") if p.failed else Text("0"))
    summary.add_row("pass@k", f"{at_k(p.pass_at_k)}  (pass: reward ≥ {num(p.pass_threshold)})")
    if p.majority_at_k:
        no_answer = f"  (no answer {p.no_answer:.1%})" if p.no_answer is not None else ""
        summary.add_row("majority@k", at_k(p.majority_at_k) + no_answer)
    summary.add_row("tasks", f"{p.tasks_never_passed} never passed · {p.tasks_always_passed} always passed")
    t = p.throughput
    rate = f"{t.rollouts_per_s:.1f} rollouts/s over {seconds(t.span_s)}" if t.rollouts_per_s else "-"
    summary.add_row("throughput", f"{rate} · tokens {t.input_tokens:,} in / {t.output_tokens:,} out")
    for name, c in p.components.items():
        summary.add_row(f"  {name}", f"mean {num(c.mean)} ± {num(c.std)} · min {num(c.min)} · max {num(c.max)}")
    parts: list[Table] = [summary]
    if p.by_env:
        parts.append(env_table(p.by_env))
    if p.by_group:
        parts.append(env_table(p.by_group, "group"))
    return Group(*parts, latency_table(p.latency))


def env_table(by_env: dict[str, Profile], key: str = "env") -> Table:
    """Every environment's (or group's) share of a run: rollouts, failures, reward, pass@k, verify time."""
    title = "per environment" if key == "env" else f"per {key}"
    table = Table(title=title, title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in (key, "rollouts", "failed", "mean reward", "pass@1", "pass@k", "verify p50"):
        table.add_column(col, justify="left" if col == key else "right", no_wrap=col == key)
    for env, p in by_env.items():
        top = p.pass_at_k[-1] if p.pass_at_k else None
        verify = p.latency.get("verify")
        table.add_row(
            env,
            str(p.present),
            str(p.failed),
            num(p.reward.mean),
            num(p.pass_at_k[0].value) if p.pass_at_k else "-",
            f"@{top.k} {top.value:.3f}" if top else "-",
            seconds(verify.p50) if verify is not None and verify.count else "-",
        )
    return table


def latency_table(latency: dict[str, Spread]) -> Table:
    table = Table(title="latency per rollout", title_justify="left", box=None, padding=(0, 2, 0, 0))
    table.add_column("hop", style="bold")
    for col in ("p50", "p90", "p99", "max", "n"):
        table.add_column(col, justify="right")
    for hop in HOPS:
        s = latency.get(hop)
        if s is None or not s.count:
            continue
        table.add_row(hop, seconds(s.p50), seconds(s.p90), seconds(s.p99), seconds(s.max), str(s.count))
    return table


def status_table(
    runs: list[dict[str, Any]], consumers: list[dict[str, Any]], models: list[dict[str, Any]] | None = None
) -> Group:
    """Runs known to the broker (manifest + live profile), the models registered, and every consumer's backlog."""
    table = Table(title="runs", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("run", "rollouts", "done", "mean reward", "pass@1", "failed", "rollouts/s", "updated"):
        table.add_column(col, justify="left" if col == "run" else "right")
    now = time.time()
    for run in runs:
        p: Profile | None = run.get("profile")
        expected = run.get("expected")
        if p is None:
            table.add_row(run["run_id"], f"0 / {expected or UNKNOWN}", "-", "-", "-", "-", "-", "no profile yet")
            continue
        pass1 = next((v.value for v in p.pass_at_k if v.k == 1), None)
        table.add_row(
            run["run_id"],
            f"{p.present} / {p.expected or UNKNOWN}",
            f"{p.completion:.0%}" if p.completion is not None else "-",
            num(p.reward.mean),
            num(pass1),
            str(p.failed),
            num(p.throughput.rollouts_per_s, 1),
            f"{max(0.0, now - p.generated_at):.0f} s ago",
        )
    backlog = Table(title="consumers", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("stream", "consumer", "pending", "in flight", "redelivered"):
        backlog.add_column(col, justify="left" if col in ("stream", "consumer") else "right")
    for c in consumers:
        backlog.add_row(c["stream"], c["name"], str(c["pending"]), str(c["ack_pending"]), str(c["redelivered"]))
    return Group(table, Text(""), models_table(models or []), Text(""), backlog)


UNKNOWN = "? (no manifest)"
"""The total of a run whose producer wrote no manifest (see `gymbus schema manifest`)."""


def models_table(models: list[dict[str, Any]]) -> Table:
    """The models bucket: each model name, its endpoints and settings, who registered it and when."""
    table = Table(title="models", title_justify="left", box=None, padding=(0, 2, 0, 0))
    for col in ("model", "endpoints", "api", "reasoning", "timeout", "attempts", "registered by", "when"):
        table.add_column(col, overflow="fold")
    now = time.time()
    for m in models:
        table.add_row(
            m["model"],
            "\n".join(m["endpoints"]) or "-",
            m["api"],
            m["reasoning"],
            f"{m['timeout_s']:g} s",
            str(m["attempts"]),
            m["written_by"] or "-",
            f"{max(0.0, now - m['written_at']):.0f} s ago" if m["written_at"] else "-",
        )
    return table
