"""The auditor: reads every stream after a run and checks that nothing was lost or duplicated.

    each submitted rollout has a Result          (lost: those without one)
    no rollout has two Results for one attempt   (duplicates)
    no Result lacks a submitted rollout          (unexpected)
    the dead-letter stream holds exactly the expected rollouts (when they are known)
    no work message of the run is left behind    (left: messages still in the work stream)

It reads without consuming (direct gets), so it can run against a live deployment.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import msgspec
from nats.js import JetStreamContext

from broker import inspect, topology
from broker.letters import dead_letter_decoder
from broker.schemas import Result, result_decoder
from runtime.engine.deadletters import lenient_ids


@dataclass
class Audit:
    run_id: str
    expected: set[str]
    """Session ids submitted."""
    stored: int = 0
    """Result messages on the run's subject."""
    latest: dict[str, Result] = field(default_factory=dict)
    """The latest attempt's Result per session."""
    duplicates: int = 0
    duplicated: set[str] = field(default_factory=set)
    """Sessions with more than one Result for one attempt."""
    unexpected: set[str] = field(default_factory=set)
    dead: Counter[str] = field(default_factory=Counter)
    """Dead letters per session of this run."""
    expected_dead: set[str] | None = None
    left: int = 0
    left_sample: list[str] = field(default_factory=list)
    """The first few messages left: subject, session and step, for the report."""

    @property
    def lost(self) -> set[str]:
        return self.expected - set(self.latest)

    @property
    def failures(self) -> Counter[str]:
        return Counter(r.failure_kind for r in self.latest.values() if r.failure_kind)

    @property
    def scored(self) -> int:
        return sum(1 for r in self.latest.values() if r.reward is not None)

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} rollout(s) have no Result: {sorted(self.lost)[:5]}")
        if self.duplicates:
            out.append(f"{self.duplicates} duplicate Result(s): {sorted(self.duplicated)[:5]}")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} Result(s) for rollouts never submitted: {sorted(self.unexpected)[:5]}")
        if self.expected_dead is not None and set(self.dead) != self.expected_dead:
            extra, missing = set(self.dead) - self.expected_dead, self.expected_dead - set(self.dead)
            out.append(f"dead letters differ: unexpected {sorted(extra)[:5]}, missing {sorted(missing)[:5]}")
        if self.left:
            out.append(f"{self.left} work message(s) of the run left in the work stream, e.g. {self.left_sample}")
        bad = [r.session_id for r in self.latest.values() if r.failed and r.reward is not None]
        if bad:
            out.append(f"failed Result(s) carrying a reward: {bad[:5]}")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems()


async def audit(js: JetStreamContext, run_id: str, expected: set[str], expected_dead: set[str] | None = None) -> Audit:
    """Read the results, dead-letter and work streams for ``run_id``."""
    a = Audit(run_id, expected, expected_dead=expected_dead)
    seen: set[tuple[str, int]] = set()
    async for m in inspect.messages(js, topology.RESULTS_STREAM, topology.result_subject(run_id)):
        r = result_decoder.decode(m.data or b"")
        a.stored += 1
        if (r.session_id, r.attempt) in seen:
            a.duplicates += 1
            a.duplicated.add(r.session_id)
        seen.add((r.session_id, r.attempt))
        if r.session_id not in expected:
            a.unexpected.add(r.session_id)
        old = a.latest.get(r.session_id)
        if old is None or r.attempt > old.attempt:
            a.latest[r.session_id] = r
    async for m in inspect.messages(js, topology.DEAD_STREAM, "gym.dead.>"):
        try:
            letter = dead_letter_decoder.decode(m.data or b"")
        except msgspec.DecodeError:
            continue
        if letter.session_id and letter.session_id.startswith(f"{run_id}."):
            a.dead[letter.session_id] += 1
    async for m in inspect.messages(js, topology.WORK_STREAM, "gym.>"):
        ids = lenient_ids(m.data or b"")
        if ids is not None and ids[1] == run_id:
            a.left += 1
            if len(a.left_sample) < 5:
                step = msgspec.json.decode(m.data or b"{}").get("step", "-")
                a.left_sample.append(f"#{m.seq} {m.subject} {ids[0]} step {step}")
    return a
