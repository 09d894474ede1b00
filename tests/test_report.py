"""report.html from run folders of every shape: conversations, escaping, graded rewards, nothing scored.

The quickstart run's report is opened in Chromium in test_profile_run.py; these check what it is built from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from runtime.profiling import report

EVIL = "</script><script>alert(1)</script>"


def row(task: int, rollout: int, reward: float | None, output: list | None = None, **extra: object) -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"task {task} {EVIL}"}]},
        "expected_answer": str(task),
        "session_id": f"r.{task}.{rollout}",
        "task_index": task,
        "rollout_index": rollout,
        "reward": reward,
        "verifier": {"extracted_answer": str(task)},
        "response": {"output": output or [], "usage": {"input_tokens": 5, "output_tokens": 2}},
        "timings": {"submitted_at": 10.0, "finished_at": 11.0 + rollout, "queue_s": 0.1, "hops": 2, "model_calls": 1},
        **extra,
    }


def write_run(tmp_path: Path, rows: list[dict], repeats: int) -> Path:
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = len({r["task_index"] for r in rows})
    meta = {"run_id": "r", "tasks": tasks, "repeats": repeats, "expected": tasks * repeats, "config": {"agent": "a"}}
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    return run_dir


def embedded_rollouts(html: str) -> list[dict]:
    data = re.search(r'<script type="application/json" id="rollouts-data">(.*?)</script>', html, re.S)
    assert data is not None
    return json.loads(data.group(1))


def test_conversation_items_of_every_kind() -> None:
    output = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": '{"expression": "1+1"}'},
        {"type": "function_call", "call_id": "c2", "name": "calculator", "arguments": "{not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{2}"}]},
        {"type": "web_search_call", "id": "w"},
    ]
    items = report.conversation(row(0, 0, 1.0, output, responses_create_params={"input": "hi", "instructions": "sys"}))
    assert [(i["kind"], i.get("role") or i.get("name")) for i in items] == [
        ("message", "system"),
        ("message", "user"),
        ("reasoning", None),
        ("call", "calculator"),
        ("call", "calculator"),
        ("output", None),
        ("message", "assistant"),
        ("other", None),
    ]
    assert items[3]["text"] == '{\n "expression": "1+1"\n}' and items[4]["text"] == "{not json"
    assert items[6]["text"] == "\\boxed{2}" and '"web_search_call"' in items[7]["text"]


def test_report_escapes_what_rollouts_say(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path, [row(0, 0, 1.0, [{"type": "message", "role": "assistant", "content": EVIL}])], 1)
    report.write_all(run_dir)
    html = (run_dir / "report.html").read_text()
    assert EVIL not in html  # neither in the task table nor in the embedded data
    [rollout] = embedded_rollouts(html)
    assert rollout["items"][-1]["text"] == EVIL  # the browser gets the text back intact
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html


def test_report_of_graded_rewards_and_many_repeats(tmp_path: Path) -> None:
    rows = [row(t, k, round((t * 20 + k) / 60, 3)) for t in range(3) for k in range(20)]
    run_dir = write_run(tmp_path, rows, 20)
    prof = report.write_all(run_dir, pass_threshold=0.5)
    html = (run_dir / "report.html").read_text()
    assert [a.k for a in prof.pass_at_k] == [1, 2, 4, 8, 16, 20]
    difficulty = re.search(r'<svg class="chart" data-chart="difficulty".*?</svg>', html, re.S)
    assert difficulty is not None and ">0%<" in difficulty.group(0) and ">90%<" in difficulty.group(0)  # binned
    reward = re.search(r'<svg class="chart" data-chart="reward".*?</svg>', html, re.S)
    assert reward is not None and reward.group(0).count("<rect") == 10  # ten bins, not 60 distinct bars
    assert len(embedded_rollouts(html)) == 60


def test_report_of_a_run_where_nothing_was_scored(tmp_path: Path) -> None:
    rows = [
        row(0, k, None, failure_kind="model_error", failure_reason="HTTP 500 past the retry budget") for k in range(2)
    ]
    run_dir = write_run(tmp_path, rows, 2)
    prof = report.write_all(run_dir)
    html = (run_dir / "report.html").read_text()
    assert prof.scored == 0 and prof.failures == {"model_error": 2} and prof.pass_at_k == []
    assert 'data-chart="failures"' in html and "over 0 scored" in html
    assert [r["failure_kind"] for r in embedded_rollouts(html)] == ["model_error", "model_error"]


def test_browser_embeds_failed_rollouts_first_when_capped() -> None:
    view = report.RowView(limit=3)
    for r in [row(t, 0, 1.0) for t in range(5)] + [row(5, 0, None, failure_kind="timeout")]:
        view.add(r)
    shown = report.browser_rows(view.kept(), 1.0)
    assert view.total == 6 and [r["task"] for r in shown] == [0, 1, 5]


def test_the_report_holds_a_bounded_number_of_rows_however_large_the_run() -> None:
    view = report.RowView(limit=3)
    for t in range(2000, 0, -1):  # arriving in the order least favourable to a cap
        view.add(row(t, 0, 1.0 if t % 500 else None, **({} if t % 500 else {"failure_kind": "timeout"})))
        assert len(view._kept) < 2 * view.limit
    assert view.total == 2000 and len(view.prompts) == 2000
    assert [(r["task_index"], r["reward"]) for r in view.kept()] == [(500, None), (1000, None), (1500, None)]
