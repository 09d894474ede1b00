"""What profiling keeps of a run: one Sample per rollout in columns, read back equal, a task at a time."""

from __future__ import annotations

import random
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.schemas import Timings, Usage
from runtime.profiling import profile
from runtime.profiling.profile import RunInfo, Sample, SampleTable


def sample(task: int, rollout: int, attempt: int = 0, *, rng: random.Random | None = None, **extra: object) -> Sample:
    rng = rng or random.Random(task * 1000 + rollout + attempt)
    scored = rng.random() < 0.8
    fields: dict[str, object] = {
        "session_id": f"run.{task}.{rollout}",
        "task_index": task,
        "rollout_index": rollout,
        "attempt": attempt,
        "reward": rng.choice([0.0, 0.25, 1.0]) if scored else None,
        "failure_kind": None if scored else rng.choice(["timeout", "model_error"]),
        "answer": rng.choice([None, "", "4", "x = 2"]),
        "reports_answer": rng.random() < 0.9,
        "env": rng.choice(["", "math", "code"]),
        "group": rng.choice(["", "algebra"]),
        "components": rng.choice([{}, {"format": 0.5, "correct": 1.0}]),
        "timings": Timings(
            submitted_at=1e9 + rng.random(),
            finished_at=1e9 + 1 + rng.random(),
            queue_s=rng.random(),
            model_s=rng.random(),
            handler_s=2 * rng.random(),
            hops=rng.randint(0, 4),
            model_calls=rng.randint(0, 2),
            tool_calls=rng.randint(0, 2),
        ),
        "usage": Usage(input_tokens=rng.randint(0, 500), output_tokens=rng.randint(0, 50)),
    }
    fields.update(extra)
    return Sample(**fields)  # type: ignore[arg-type]


keys = st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 2), st.sampled_from(["usual", "odd", "far"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(keys, max_size=40))
def test_the_table_keeps_what_a_dict_of_samples_keeps(arrivals: list[tuple[int, int, int, str]]) -> None:
    """Samples arriving in any order, attempts superseding, repeats and stale attempts ignored, ids that
    are not the run's usual ones and rollout indices far past the others: read back, the table holds
    exactly the Samples the keep-the-latest rule over a dict holds, in (task, rollout) order."""
    table, kept = SampleTable("run"), {}
    for task, rollout, attempt, shape in arrivals:
        extra: dict[str, object] = {}
        if shape == "odd":
            extra["session_id"] = f"other-{task}-{rollout}"
        elif shape == "far":
            extra = {
                "rollout_index": rollout + 10 * SampleTable.GROW,
                "session_id": f"run.{task}.{rollout + 10 * SampleTable.GROW}",
            }
        s = sample(task, rollout, attempt, **extra)
        assert table.add(s) == profile.keep(kept, s)
    expected = sorted(kept.values(), key=lambda s: (s.task_index, s.rollout_index))
    assert list(table) == expected and len(table) == len(kept)
    assert all(sid in table for sid in kept) and "run.9.9" not in table and 7 not in table
    assert max((len(a) for a in table._slots.values()), default=0) <= 6  # the far ones went to the dict


def test_a_profile_from_the_table_equals_the_profile_from_its_samples() -> None:
    """`build` over the table a task at a time, splits by environment and group included, gives the
    profile it gives for the same Samples passed as a list (a table is made of them)."""
    rng = random.Random(7)
    samples = [sample(t, k, rng=rng) for t in range(6) for k in range(5)]
    info = RunInfo(run_id="run", tasks=8, repeats=5, expected=40)
    table = SampleTable("run")
    for s in reversed(samples):
        table.add(s)
    a, tasks_a = profile.build(info, samples, source="offline")
    b, tasks_b = profile.build(info, table, source="offline")
    assert profile.comparable(a) == profile.comparable(b) and tasks_a == tasks_b
    assert set(a.by_env) == {"-", "code", "math"} and any(p.by_group for p in a.by_env.values())  # nested too
    assert a.present == 30 and len(tasks_a) == 8 and tasks_a[7].present == 0
    math_only = [s for s in samples if s.env == "math"]
    by_hand, _ = profile.build(RunInfo(run_id="run", repeats=5), math_only, source="offline")
    assert profile.comparable(a.by_env["math"]) == profile.comparable(by_hand)


def test_a_rollout_costs_under_200_bytes() -> None:
    """A dict of Sample structs took ~540 bytes a rollout (620 with the live profiler's other state):
    the 1,000,000-rollout run's live profiler reached 817 MB. The table holds a rollout in columns."""
    rng = random.Random(1)
    samples = [sample(t, k, rng=rng, components={}) for t in range(24) for k in range(2_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        table = SampleTable("run")
        for s in samples:
            table.add(s)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(table) == 48_000 and held / len(table) < 200, f"{held / len(table):.0f} bytes a rollout"
