"""A profile of rollouts: failures apart from rewards, thresholds, one Sample per rollout, run folders."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from broker.schemas import Timings, Usage
from runtime.profiling import profile, runfolder
from runtime.profiling.profile import ProfileError, RunInfo, Sample


def sample(task: int, rollout: int, reward: float | None, *, kind: str | None = None, **extra: object) -> Sample:
    return Sample(
        session_id=f"r.{task}.{rollout}",
        task_index=task,
        rollout_index=rollout,
        reward=reward,
        failure_kind=kind if reward is None else None,
        **extra,  # type: ignore[arg-type]
    )


def test_failures_are_counted_by_kind_and_kept_out_of_reward_statistics() -> None:
    samples = [
        sample(0, 0, 1.0),
        sample(0, 1, 0.0),
        sample(0, 2, None, kind="model_error"),
        sample(1, 0, 1.0),
        sample(1, 1, 1.0),
        sample(1, 2, None, kind="timeout"),
        sample(2, 0, None, kind="timeout"),
    ]
    prof, tasks = profile.build(RunInfo(run_id="r", tasks=3, repeats=3, expected=9), samples, source="offline")
    assert (prof.present, prof.scored, prof.failed) == (7, 4, 3)
    assert prof.failures == {"timeout": 2, "model_error": 1}
    assert prof.reward.count == 4 and prof.reward.mean == 0.75 and prof.reward.min == 0.0  # not 3/7
    assert prof.completion == pytest.approx(7 / 9)
    assert [(t.scored, t.failed, t.passed) for t in tasks] == [(2, 1, 1), (2, 1, 2), (0, 1, 0)]
    assert tasks[0].pass_at_k == {"1": 0.5, "2": 1.0}  # over the 2 scored rollouts: a failure is no sample
    assert tasks[2].pass_rate is None and tasks[2].pass_at_k == {}
    # pass@k over the tasks that have k scored rollouts; k=3 has none
    assert [(a.k, a.value, a.tasks) for a in prof.pass_at_k] == [(1, 0.75, 2), (2, 1.0, 2)]
    assert (prof.tasks_never_passed, prof.tasks_always_passed) == (0, 1)


def test_pass_threshold_decides_passing_for_graded_rewards() -> None:
    samples = [sample(0, i, r) for i, r in enumerate([0.2, 0.6, 0.9, 0.5])]
    strict, _ = profile.build(RunInfo(run_id="r", repeats=4), samples, source="offline")
    half, tasks = profile.build(RunInfo(run_id="r", repeats=4, pass_threshold=0.5), samples, source="offline")
    assert strict.pass_rate == 0.0 and strict.pass_at_k[-1].value == 0.0
    assert half.pass_rate == 0.75 and tasks[0].passed == 3
    assert half.reward.mean == pytest.approx(0.55)  # the reward itself is untouched


def test_majority_at_k_needs_extracted_answers() -> None:
    with_answers = [
        sample(0, 0, 1.0, answer="42", reports_answer=True),
        sample(0, 1, 0.0, answer="41", reports_answer=True),
        sample(0, 2, 1.0, answer="42", reports_answer=True),
        sample(0, 3, 0.0, answer=None, reports_answer=True),
    ]
    prof, tasks = profile.build(RunInfo(run_id="r", repeats=4), with_answers, source="offline")
    # pairs: {42,42} 1, {42,41} x2 tie 0.5, {42,None} x2 1, {41,None} 0 -> 4/6
    assert [(a.k, a.value) for a in prof.majority_at_k] == [(1, 0.5), (2, pytest.approx(2 / 3)), (4, 1.0)]
    assert prof.no_answer == 0.25 and tasks[0].majority_at_k["4"] == 1.0
    plain, _ = profile.build(RunInfo(run_id="r"), [sample(0, 0, 1.0)], source="offline")
    assert plain.majority_at_k == [] and plain.no_answer is None


def test_latency_by_hop_and_throughput() -> None:
    t = Timings(
        submitted_at=100.0,
        finished_at=102.0,
        queue_s=0.5,
        model_s=1.0,
        tool_s=0.1,
        verify_s=0.2,
        handler_s=1.5,
        hops=4,
        model_calls=2,
        tool_calls=1,
    )
    samples = [
        sample(0, 0, 1.0, timings=t, usage=Usage(input_tokens=10, output_tokens=5)),
        sample(0, 1, None, kind="invalid_input", timings=Timings(finished_at=101.0)),  # built outside any handler
    ]
    prof, _ = profile.build(RunInfo(run_id="r"), samples, source="offline")
    lat = prof.latency
    assert (lat["queue"].p50, lat["model"].p50, lat["tool"].p50, lat["verify"].p50) == (0.5, 1.0, 0.1, 0.2)
    assert lat["overhead"].p50 == pytest.approx(0.2) and lat["total"].max == 2.0 and lat["total"].count == 1
    assert prof.throughput.span_s == 2.0 and prof.throughput.rollouts_per_s == 0.5
    assert (prof.throughput.input_tokens, prof.throughput.output_tokens) == (10, 5)


def test_one_sample_per_rollout_the_latest_attempt_wins() -> None:
    kept: dict[str, Sample] = {}
    assert profile.keep(kept, sample(0, 0, None, kind="timeout"))
    assert not profile.keep(kept, sample(0, 0, 1.0))  # the same attempt again: a duplicate
    assert profile.keep(kept, Sample(session_id="r.0.0", task_index=0, rollout_index=0, attempt=1, reward=1.0))
    assert not profile.keep(kept, sample(0, 0, None, kind="timeout"))  # an older attempt arriving late
    assert [(s.attempt, s.reward) for s in kept.values()] == [(1, 1.0)]


def write_run(tmp_path: Path, lines: list[str], meta: dict | None = None) -> Path:
    run_dir = tmp_path / "run1"
    run_dir.mkdir()
    (run_dir / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "metadata.json").write_text(json.dumps(meta or {"run_id": "run1", "tasks": 1, "repeats": 2}))
    return run_dir


ROW = {"session_id": "run1.0.0", "task_index": 0, "rollout_index": 0, "reward": 1.0, "verifier": {}, "timings": {}}


def test_offline_profile_reads_the_run_folder_and_writes_its_files(tmp_path: Path) -> None:
    second = {**ROW, "session_id": "run1.0.1", "rollout_index": 1, "reward": None, "failure_kind": "tool_error"}
    meta = {"run_id": "run1", "tasks": 1, "repeats": 2, "expected": 2, "config": {"profile": {"pass_threshold": 0.5}}}
    run_dir = write_run(tmp_path, [json.dumps(ROW), json.dumps(second)], meta)
    rows: list[dict[str, object]] = []
    info, samples = runfolder.load(run_dir, on_row=rows.append)
    assert info.pass_threshold == 0.5 and len(rows) == len(samples) == 2
    prof, tasks = profile.build(info, samples, source="offline")
    runfolder.write(run_dir, prof, tasks)
    written = json.loads((run_dir / "profile.json").read_text())
    assert written["failures"] == {"tool_error": 1} and written["reward"]["count"] == 1
    assert [json.loads(line)["task_index"] for line in (run_dir / "tasks.jsonl").read_text().splitlines()] == [0]
    assert runfolder.load(run_dir, pass_threshold=2.0)[0].pass_threshold == 2.0


@pytest.mark.parametrize(
    "line,message",
    [
        ("{not json", "line 2 is not valid JSON"),
        ("[1, 2]", "line 2 is a JSON list, not an object"),
        (json.dumps({**ROW, "task_index": "zero"}), "row 2: Expected `int`, got `str` - at `$.task_index`"),
        (json.dumps({k: v for k, v in ROW.items() if k != "session_id"}), "row 2: Object missing required field"),
        (json.dumps({**ROW, "reward": None}), "row 2: a row with `reward` null must have a `failure_kind`"),
    ],
)
def test_offline_profile_names_the_bad_line_and_field(tmp_path: Path, line: str, message: str) -> None:
    run_dir = write_run(tmp_path, [json.dumps(ROW), line])
    with pytest.raises(ProfileError, match=re.escape(message)):
        runfolder.load(run_dir)


def test_offline_profile_of_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="does not exist"):
        runfolder.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match=r"has no rollouts\.jsonl"):
        runfolder.load(tmp_path / "empty")


def test_samples_share_their_recurring_strings_and_hold_no_garbage_collector_slot() -> None:
    """A live profile holds one Sample per rollout (a million in a large run): the environment, a task's
    answers and the failure kinds are one string each across them, and no Sample is tracked by the GC."""
    import gc

    from broker.schemas import result_decoder

    def decoded(rollout: int, answer: str, kind: str | None = None) -> Sample:
        raw = {
            "session_id": f"r.0.{rollout}",
            "run_id": "r",
            "task_index": 0,
            "rollout_index": rollout,
            "env": "ma" + "th",
            "reward": None if kind else 1.0,
            "failure_kind": kind,
            "verifier": {"extracted_answer": answer},
        }
        return Sample.of(result_decoder.decode(json.dumps(raw)))

    a, b, c, d = decoded(0, "138"), decoded(1, "138"), decoded(2, "x", "timeout"), decoded(3, "x", "timeout")
    assert a.env is b.env and a.answer is b.answer and c.failure_kind is d.failure_kind
    assert a.components is b.components and a.components == {}
    assert not any(gc.is_tracked(x) for x in (a, a.timings, a.usage))
