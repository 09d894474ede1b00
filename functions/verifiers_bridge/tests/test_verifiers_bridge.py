"""verifiers_bridge: an environment package written here (no hub) provides the tasks and the rubric."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verifiers.v1", reason="verifiers is not installed (pip install -e '.[verifiers]')")

from functions.verifiers_bridge import tasksets
from runtime.checking import check
from runtime.cli import app
from runtime.errors import InvalidInput, VerifierError
from runtime.testing import collect_rows

PACKAGE = '''
"""Reverse the words of a phrase: most of the reward for the exact order, some for every word kept."""
import verifiers.v1 as vf


class WordsData(vf.TaskData):
    words: str
    answer: str


class WordsTask(vf.Task[WordsData]):
    @vf.reward(weight=0.75)
    async def reversed_exactly(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.25)
    async def words_kept(self, task, trace) -> float:
        return float(sorted(trace.last_reply.split()) == sorted(task.words.split()))

    @vf.metric
    async def turns(self, trace) -> float:
        return float(trace.num_turns)


class WordsConfig(vf.TasksetConfig):
    n: int = 3


class WordsTaskset(vf.Taskset[WordsTask, WordsConfig]):
    def load(self):
        for i in range(self.config.n):
            words = f"alpha beta gamma{i}"
            data = WordsData(
                prompt=f"Reverse the order of these words: {words}",
                system_prompt="Answer with the words only.",
                words=words,
                answer=" ".join(reversed(words.split())),
            )
            yield WordsTask(data, self.config.task)


__all__ = ["WordsTaskset"]
'''

SANDBOXED = """
import verifiers.v1 as vf


class BoxTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def file_written(self, runtime) -> float:
        return 1.0


class BoxTaskset(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="write a file"), self.config.task)


__all__ = ["BoxTaskset"]
"""


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The environment packages, importable here and in the workers collect starts."""
    root = tmp_path_factory.mktemp("vf_packages")
    for name, source in (("gymbus_words", PACKAGE), ("gymbus_boxed", SANDBOXED)):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(source)
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(root))
    mp.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def rows_file(packages: Path) -> Path:
    from typer.testing import CliRunner

    out = packages / "rows.jsonl"
    result = CliRunner().invoke(app, ["tasks", "verifiers", "gymbus_words", "--args", '{"n": 4}', "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_packages_tasks_become_rows(rows_file: Path) -> None:
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(rows) == 4
    assert rows[1]["responses_create_params"]["input"] == [
        {"role": "system", "content": "Answer with the words only."},
        {"role": "user", "content": "Reverse the order of these words: alpha beta gamma1"},
    ]
    assert rows[1]["verifiers"] == {"taskset": "gymbus_words", "args": {"n": 4}}
    assert rows[1]["task"]["answer"] == "gamma1 beta alpha" and rows[1]["task"]["idx"] == 1


def test_a_taskset_that_does_not_load_is_one_line(packages: Path) -> None:
    from typer.testing import CliRunner

    bad = CliRunner().invoke(app, ["tasks", "verifiers", "gymbus_nosuch", "-o", str(packages / "x.jsonl")])
    assert bad.exit_code == 2 and "verifiers taskset 'gymbus_nosuch' does not load" in bad.output
    wrong = CliRunner().invoke(app, ["tasks", "verifiers", "gymbus_words", "--args", "[1]", "-o", "x.jsonl"])
    assert wrong.exit_code == 2 and "expected a JSON object" in wrong.output


async def test_the_rubric_scores_the_conversation(packages: Path) -> None:
    row = next(tasksets.rows("gymbus_words", {"n": 1}))
    given = row["responses_create_params"]["input"]

    async def scored(text: str) -> tuple[float, dict]:
        said = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]
        trace = await tasksets.score("gymbus_words", {"n": 1}, row["task"], given, said)
        return trace.reward, {k: r.score for k, r in trace.rewards.items()}

    assert await scored("gamma0 beta alpha") == (1.0, {"reversed_exactly": 1.0, "words_kept": 1.0})
    assert await scored("alpha beta gamma0") == (0.25, {"reversed_exactly": 0.0, "words_kept": 1.0})
    assert await scored("no idea") == (0.0, {"reversed_exactly": 0.0, "words_kept": 0.0})


def test_tool_calls_become_one_assistant_turn() -> None:
    items: list[dict[str, Any]] = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "2"}]},
    ]
    out = [
        (m.role, getattr(m, "tool_calls", None) and m.tool_calls[0].name, sampled)
        for m, sampled in tasksets.messages(items)
    ]
    assert out == [("assistant", "add", True), ("tool", None, False), ("assistant", None, True)]


async def test_a_rubric_needing_a_sandbox_is_a_verifier_error_not_a_zero(packages: Path) -> None:
    row = next(tasksets.rows("gymbus_boxed", {}))
    with pytest.raises(VerifierError, match="need a sandbox runtime"):
        await tasksets.score("gymbus_boxed", {}, row["task"], [], [])
    with pytest.raises(InvalidInput, match="task field `task`"):
        await tasksets.score("gymbus_words", {}, {"prompt": "x"}, [], [])


async def test_check_passes_both_ways(rows_file: Path) -> None:
    report = await check("verifiers_bridge", rows_file)
    assert report.ok, [t.problems for t in report.tasks]
    assert report.right(0).verifier["components"] == {"reversed_exactly": 1.0, "words_kept": 1.0}


async def test_rows_through_collect(rows_file: Path, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    summary, out = await collect_rows(tmp_path, rows, env="verifiers_bridge", repeats=2)
    assert [r["reward"] for r in out] == [1.0] * 8
    assert out[0]["verifier"]["metrics"] == {"turns": 1.0}
    profile = json.loads((summary.run_dir / "profile.json").read_text())
    assert set(profile["components"]) == {"reversed_exactly", "words_kept"}
