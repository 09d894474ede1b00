"""A run's reward profile: per-task and run-wide reward statistics, pass@k, majority@k, failures, latency.

One computation, two sources. The live profiler (runtime/profiling/profiler.py) folds Results from the results
stream into Samples; the offline path (``gymbus profile runs/<run_id>/``, runtime/profiling/runfolder.py) reads
them back from ``rollouts.jsonl``. Both keep one Sample per rollout (its latest attempt) and call `build`, so the
same Results give the same profile.

Failures are counted by kind and kept out of every reward statistic: a failed rollout has no reward,
it is not a wrong answer. pass@k and majority@k are per task over its scored rollouts, then averaged
over the tasks that have at least k of them (`AtK.tasks` says how many).
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any, Literal

import msgspec

from broker.schemas import Result, Timings, Usage
from runtime.errors import UsageError
from runtime.profiling.components import component_stats, components_of
from runtime.profiling.estimators import Spread, Stats, describe, ks, majority_at_k, pass_at_k, spread

HOPS = ("queue", "model", "tool", "verify", "overhead", "total")
"""Latency rows: time waiting in queues, in model calls, in tools, in the verifier, in gymbus itself, end to end."""


class ProfileError(UsageError, ValueError):
    """A run folder cannot be profiled; the message names the file, line and field."""


NO_COMPONENTS: dict[str, float] = {}
"""The components of every Sample whose verifier reports none (one shared dict; never written to)."""


class Sample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What profiling keeps of one Result: small enough to hold a large run in memory (untracked by the
    garbage collector: it holds no cycles, and a million of them made every full collection scan them)."""

    session_id: str
    task_index: int
    rollout_index: int
    attempt: int = 0
    reward: float | None = None
    failure_kind: str | None = None
    answer: str | None = None
    """The verifier's ``extracted_answer``, as text."""
    reports_answer: bool = False
    """Whether the verifier reports ``extracted_answer`` at all (majority@k needs it)."""
    timings: Timings = msgspec.field(default_factory=Timings)
    usage: Usage = msgspec.field(default_factory=Usage)
    env: str = ""
    """The environment that scored it (a run may mix them)."""
    components: dict[str, float] = {}
    """The reward's components, when the verifier reports them (``components`` in its info)."""
    group: str = ""
    """What the verifier groups the task under (``group`` in its info: reasoning_gym's generator)."""

    @classmethod
    def of(cls, r: Result) -> Sample:
        # the same few strings recur over a run's rollouts (its environment, a task's answers, failure
        # kinds): each Sample shares one copy, and one empty components dict, instead of its own
        answer = _answer(r.verifier)
        return cls(
            env=sys.intern(r.env),
            group=sys.intern(str(r.verifier.get("group") or "")),
            components=components_of(r.verifier) or NO_COMPONENTS,
            session_id=r.session_id,
            task_index=r.task_index,
            rollout_index=r.rollout_index,
            attempt=r.attempt,
            reward=r.reward,
            failure_kind=r.failure_kind and sys.intern(r.failure_kind),
            answer=answer and sys.intern(answer),
            reports_answer="extracted_answer" in r.verifier,
            timings=r.timings,
            usage=r.usage,
        )


def _answer(verifier: dict[str, Any]) -> str | None:
    a = verifier.get("extracted_answer")
    return None if a is None else str(a)


def keep(samples: dict[str, Sample], s: Sample) -> bool:
    """Fold a Sample into one-per-rollout: a later attempt replaces, a repeat of the same attempt is ignored.

    This is the rule ``gymbus collect`` applies to the results stream, so its ``rollouts.jsonl``
    and the live profiler hold the same Samples. True if ``samples`` changed.
    """
    old = samples.get(s.session_id)
    if old is not None and s.attempt <= old.attempt:
        return False
    samples[s.session_id] = s
    return True


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
    info: RunInfo, samples: Iterable[Sample], *, source: Literal["live", "offline"]
) -> tuple[Profile, list[TaskProfile]]:
    """The profile of a run and one row per task, from one Sample per rollout."""
    ordered = sorted(samples, key=lambda s: (s.task_index, s.rollout_index))
    by_task: dict[int, list[Sample]] = defaultdict(list)
    for s in ordered:
        by_task[s.task_index].append(s)
    indices = sorted(set(range(info.tasks or 0)) | set(by_task))
    n_max = info.repeats or max((len(v) for v in by_task.values()), default=0)
    k_list = ks(n_max)
    answers = any(s.reports_answer for s in ordered if s.reward is not None)
    tasks = [_task(i, by_task.get(i, []), info, k_list, answers) for i in indices]
    scored = [s for s in ordered if s.reward is not None]
    failures = Counter(s.failure_kind or "unknown" for s in ordered if s.reward is None)
    passed = [s for s in scored if s.reward is not None and s.reward >= info.pass_threshold]
    rated = [t for t in tasks if t.scored]
    profile = Profile(
        run_id=info.run_id,
        source=source,
        generated_at=time.time(),
        expected=info.expected,
        present=len(ordered),
        completion=len(ordered) / info.expected if info.expected else None,
        tasks=len(indices),
        repeats=info.repeats,
        scored=len(scored),
        failed=sum(failures.values()),
        failures=dict(failures.most_common()),
        pass_threshold=info.pass_threshold,
        reward=describe([s.reward for s in scored if s.reward is not None]),
        pass_rate=len(passed) / len(scored) if scored else None,
        pass_at_k=_mean_at_k(tasks, k_list, "pass_at_k"),
        majority_at_k=_mean_at_k(tasks, k_list, "majority_at_k") if answers else [],
        no_answer=_no_answer(scored) if answers else None,
        tasks_never_passed=sum(1 for t in rated if t.passed == 0),
        tasks_always_passed=sum(1 for t in rated if t.passed == t.scored),
        latency=latency(ordered),
        throughput=_throughput(ordered),
        components=component_stats([s.components for s in scored]),
        by_env=_split(info, ordered, source, "env"),
        by_group=_split(info, ordered, source, "group"),
    )
    return profile, tasks


def _split(
    info: RunInfo, samples: list[Sample], source: Literal["live", "offline"], key: Literal["env", "group"]
) -> dict[str, Profile]:
    """One profile per environment (or per group) when there are several (its tasks are those with a
    Result there)."""
    values = sorted({getattr(s, key) for s in samples})
    if len(values) < 2:
        return {}
    sub = RunInfo(run_id=info.run_id, repeats=info.repeats, pass_threshold=info.pass_threshold)
    return {v or "-": build(sub, [s for s in samples if getattr(s, key) == v], source=source)[0] for v in values}


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


def _no_answer(scored: list[Sample]) -> float | None:
    reporting = [s for s in scored if s.reports_answer]
    return sum(1 for s in reporting if s.answer is None) / len(reporting) if reporting else None


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


def latency(samples: list[Sample]) -> dict[str, Spread]:
    values: dict[str, list[float]] = {h: [] for h in HOPS}
    for s in samples:
        for hop, v in hop_seconds(s).items():
            values[hop].append(v)
    return {h: spread(v) for h, v in values.items()}


def _throughput(samples: list[Sample]) -> Throughput:
    timed = [s.timings for s in samples if s.timings.submitted_at and s.timings.finished_at]
    span = max(t.finished_at for t in timed) - min(t.submitted_at for t in timed) if timed else None
    n = len(samples)
    tokens_in = sum(s.usage.input_tokens for s in samples)
    tokens_out = sum(s.usage.output_tokens for s in samples)
    return Throughput(
        rollouts_per_s=len(timed) / span if span else None,
        span_s=span,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        mean_input_tokens=tokens_in / n if n else None,
        mean_output_tokens=tokens_out / n if n else None,
    )


def comparable(profile: Profile) -> dict[str, Any]:
    """A profile without what differs by how it was made (source, time, stream position)."""
    out = msgspec.to_builtins(profile)
    for key in ("source", "generated_at", "last_seq"):
        out.pop(key, None)
    return out
