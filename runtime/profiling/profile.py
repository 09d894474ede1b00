"""A run's reward profile: per-task and run-wide reward statistics, pass@k, majority@k, failures, latency.

One computation, two sources. The live profiler (runtime/profiling/profiler.py) folds Results from the results
stream into Samples; the offline path (``gymbus profile runs/<run_id>/``, runtime/profiling/runfolder.py) reads
them back from ``rollouts.jsonl``. Both keep one Sample per rollout (its latest attempt) in a `SampleTable` and
call `build`, so the same Results give the same profile. `build` reads the table a task at a time: besides the
table it holds a few numbers per rollout (its reward and hop times), never the run's Samples at once.

Failures are counted by kind and kept out of every reward statistic: a failed rollout has no reward,
it is not a wrong answer. pass@k and majority@k are per task over its scored rollouts, then averaged
over the tasks that have at least k of them (`AtK.tasks` says how many).
"""

from __future__ import annotations

import math
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import msgspec

from runtime.errors import UsageError
from runtime.profiling.estimators import Spread, Stats, describe, ks, majority_at_k, pass_at_k, spread
from runtime.profiling.sample import NO_COMPONENTS, Sample, keep
from runtime.profiling.table import SampleTable, Where

__all__ = ["NO_COMPONENTS", "Sample", "SampleTable", "keep"]  # re-exported: their home was this module

HOPS = ("queue", "model", "tool", "verify", "overhead", "total")
"""Latency rows: time waiting in queues, in model calls, in tools, in the verifier, in gymbus itself, end to end."""


class ProfileError(UsageError, ValueError):
    """A run folder cannot be profiled; the message names the file, line and field."""


class RunInfo(msgspec.Struct, kw_only=True):
    """What a profile needs to know of a run besides its Results (from metadata.json or the run manifest)."""

    run_id: str
    tasks: int | None = None
    """Task rows in the run; tasks with no Result yet still get a row."""
    repeats: int | None = None
    """Rollouts per task: the largest k of pass@k."""
    expected: int | None = None
    """Rollouts the run submits in all."""
    pass_threshold: float = 1.0
    """A scored rollout passes when its reward is at least this."""


class AtK(msgspec.Struct, kw_only=True):
    k: int
    value: float
    """Mean over the tasks with at least k scored rollouts."""
    tasks: int
    """How many tasks that is."""


class Throughput(msgspec.Struct, kw_only=True):
    rollouts_per_s: float | None = None
    """Results over the span from the first submission to the last finish."""
    span_s: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None


class TaskProfile(msgspec.Struct, kw_only=True):
    """One row of ``tasks.jsonl``."""

    task_index: int
    expected: int | None
    present: int
    """Rollouts of this task with a Result (scored or failed)."""
    scored: int
    failed: int
    failures: dict[str, int]
    passed: int
    pass_rate: float | None
    """passed / scored: the task's difficulty (low is hard)."""
    reward: Stats
    pass_at_k: dict[str, float]
    """k -> unbiased pass@k, for k up to the scored count."""
    majority_at_k: dict[str, float] = {}
    """k -> 1.0 if the majority answer of the first k scored rollouts passed (when answers are reported)."""


class Profile(msgspec.Struct, kw_only=True):
    """``profile.json``: the run at a glance."""

    run_id: str
    source: Literal["live", "offline"]
    generated_at: float
    expected: int | None
    present: int
    completion: float | None
    """present / expected."""
    tasks: int
    repeats: int | None
    scored: int
    failed: int
    failures: dict[str, int]
    """Failed rollouts by failure kind; they have no reward and are in no reward statistic."""
    pass_threshold: float
    reward: Stats
    pass_rate: float | None
    """Share of scored rollouts that passed."""
    pass_at_k: list[AtK]
    majority_at_k: list[AtK] = []
    no_answer: float | None = None
    """Share of scored rollouts whose verifier extracted no answer (when it reports answers)."""
    tasks_never_passed: int = 0
    tasks_always_passed: int = 0
    latency: dict[str, Spread] = {}
    """Seconds per rollout, by hop (see HOPS)."""
    throughput: Throughput = msgspec.field(default_factory=Throughput)
    last_seq: int = 0
    """Live only: the last results-stream sequence folded in."""
    components: dict[str, Stats] = {}
    """Per reward component (when the verifier reports ``components``): its statistics over scored rollouts."""
    by_env: dict[str, Profile] = {}
    """When the run mixes environments: every statistic above, per environment."""
    by_group: dict[str, Profile] = {}
    """When verifiers report several groups (``group`` in their info): every statistic above, per group."""


def build(
    info: RunInfo, samples: Iterable[Sample] | SampleTable, *, source: Literal["live", "offline"]
) -> tuple[Profile, list[TaskProfile]]:
    """The profile of a run and one row per task, from one Sample per rollout."""
    table = samples if isinstance(samples, SampleTable) else SampleTable.of(samples)
    return _build(info, table, source, ())


def _build(
    info: RunInfo, table: SampleTable, source: Literal["live", "offline"], where: Where
) -> tuple[Profile, list[TaskProfile]]:
    counts, answers = {}, False
    for t, pairs in table.rows_by_task(where):
        counts[t] = len(pairs)
        answers = answers or any(table.scored(r) and table.reports_answer(r) for _, r in pairs)
    indices = sorted(set(range(info.tasks or 0)) | counts.keys())
    k_list = ks(info.repeats or max(counts.values(), default=0))
    fold = _Fold(info.pass_threshold)
    tasks = []
    for index, task_samples in _every_task(indices, table.by_task(where)):
        fold.add(task_samples)
        tasks.append(_task(index, task_samples, info, k_list, answers))
    rated = [t for t in tasks if t.scored]
    n, scored = fold.present, len(fold.rewards)
    profile = Profile(
        run_id=info.run_id,
        source=source,
        generated_at=time.time(),
        expected=info.expected,
        present=n,
        completion=n / info.expected if info.expected else None,
        tasks=len(indices),
        repeats=info.repeats,
        scored=scored,
        failed=sum(fold.failures.values()),
        failures=dict(fold.failures.most_common()),
        pass_threshold=info.pass_threshold,
        reward=describe(fold.rewards),
        pass_rate=fold.passed / scored if scored else None,
        pass_at_k=_mean_at_k(tasks, k_list, "pass_at_k"),
        majority_at_k=_mean_at_k(tasks, k_list, "majority_at_k") if answers else [],
        no_answer=fold.no_answer / fold.reporting if answers and fold.reporting else None,
        tasks_never_passed=sum(1 for t in rated if t.passed == 0),
        tasks_always_passed=sum(1 for t in rated if t.passed == t.scored),
        latency={h: spread(v) for h, v in fold.hops.items()},
        throughput=fold.throughput(),
        components={name: describe(v) for name, v in sorted(fold.components.items())},
        by_env=_split(info, table, source, where, "env"),
        by_group=_split(info, table, source, where, "group"),
    )
    return profile, tasks


def _every_task(indices: list[int], present: Iterator[tuple[int, list[Sample]]]) -> Iterator[tuple[int, list[Sample]]]:
    """Each task index with its Samples (none for a task with no Result yet), in order."""
    nxt = next(present, None)
    for i in indices:
        if nxt is not None and nxt[0] == i:
            yield nxt
            nxt = next(present, None)
        else:
            yield i, []


class _Fold:
    """The run-wide statistics, folded a task at a time: counts, and per rollout only its reward and
    its time in each hop (8 bytes each)."""

    def __init__(self, pass_threshold: float) -> None:
        self.pass_threshold = pass_threshold
        self.present = self.passed = self.reporting = self.no_answer = 0
        self.rewards: array[float] = array("d")
        self.failures: Counter[str] = Counter()
        self.hops: dict[str, array[float]] = {h: array("d") for h in HOPS}
        self.components: dict[str, array[float]] = {}
        self.timed = self.tokens_in = self.tokens_out = 0
        self.first, self.last = math.inf, -math.inf

    def add(self, samples: list[Sample]) -> None:
        for s in samples:
            self.present += 1
            self.tokens_in += s.usage.input_tokens
            self.tokens_out += s.usage.output_tokens
            t = s.timings
            if t.submitted_at and t.finished_at:
                self.timed += 1
                self.first, self.last = min(self.first, t.submitted_at), max(self.last, t.finished_at)
            for hop, v in hop_seconds(s).items():
                self.hops[hop].append(v)
            if s.reward is None:
                self.failures[s.failure_kind or "unknown"] += 1
                continue
            self.rewards.append(s.reward)
            self.passed += s.reward >= self.pass_threshold
            if s.reports_answer:
                self.reporting += 1
                self.no_answer += s.answer is None
            for name, v in s.components.items():
                self.components.setdefault(name, array("d")).append(v)

    def throughput(self) -> Throughput:
        span = self.last - self.first if self.timed else None
        n = self.present
        return Throughput(
            rollouts_per_s=self.timed / span if span else None,
            span_s=span,
            input_tokens=self.tokens_in,
            output_tokens=self.tokens_out,
            mean_input_tokens=self.tokens_in / n if n else None,
            mean_output_tokens=self.tokens_out / n if n else None,
        )


def _split(
    info: RunInfo, table: SampleTable, source: Literal["live", "offline"], where: Where, key: Literal["env", "group"]
) -> dict[str, Profile]:
    """One profile per environment (or per group) when there are several (its tasks are those with a
    Result there)."""
    values = table.distinct(key, where)
    if len(values) < 2:
        return {}
    sub = RunInfo(run_id=info.run_id, repeats=info.repeats, pass_threshold=info.pass_threshold)
    return {v or "-": _build(sub, table, source, (*where, (key, v)))[0] for v in values}


def _task(index: int, samples: list[Sample], info: RunInfo, k_list: list[int], answers: bool) -> TaskProfile:
    scored = [s for s in samples if s.reward is not None]
    rewards = [s.reward for s in scored if s.reward is not None]
    n = len(scored)
    c = sum(1 for r in rewards if r >= info.pass_threshold)
    votes = [(s.answer, s.reward is not None and s.reward >= info.pass_threshold) for s in scored]
    failures = Counter(s.failure_kind or "unknown" for s in samples if s.reward is None)
    return TaskProfile(
        task_index=index,
        expected=info.repeats,
        present=len(samples),
        scored=n,
        failed=sum(failures.values()),
        failures=dict(failures.most_common()),
        passed=c,
        pass_rate=c / n if n else None,
        reward=describe(rewards),
        pass_at_k={str(k): pass_at_k(n, c, k) for k in k_list if k <= n},
        majority_at_k={str(k): majority_at_k(votes, k) for k in k_list if k <= n} if answers else {},
    )


def _mean_at_k(tasks: list[TaskProfile], k_list: list[int], field: str) -> list[AtK]:
    out = []
    for k in k_list:
        values = [v for t in tasks if (v := getattr(t, field).get(str(k))) is not None]
        if values:
            out.append(AtK(k=k, value=sum(values) / len(values), tasks=len(values)))
    return out


def hop_seconds(s: Sample) -> dict[str, float]:
    """A rollout's time by hop; hops it never took are left out (a Result built outside any handler has none)."""
    t = s.timings
    if t.hops == 0:
        return {"total": t.total_s} if t.submitted_at else {}
    out = {
        "queue": t.queue_s,
        "model": t.model_s,
        "tool": t.tool_s,
        "verify": t.verify_s,
        "overhead": max(0.0, t.handler_s - t.model_s - t.tool_s - t.verify_s),
    }
    if t.submitted_at:
        out["total"] = t.total_s
    if not t.tool_calls:
        del out["tool"]
    if not t.model_calls:
        del out["model"]
    return out


def comparable(profile: Profile) -> dict[str, Any]:
    """A profile without what differs by how it was made (source, time, stream position)."""
    out = msgspec.to_builtins(profile)
    for key in ("source", "generated_at", "last_seq"):
        out.pop(key, None)
    for split in ("by_env", "by_group"):
        out[split] = {name: comparable(p) for name, p in getattr(profile, split).items()}
    return out
