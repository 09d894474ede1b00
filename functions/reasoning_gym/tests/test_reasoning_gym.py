"""reasoning_gym: rows generated offline, scored by the package's scorers, a profile per generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install -e '.[reasoning_gym]')")

from functions.reasoning_gym import generate, scoring
from runtime.checking import check
from runtime.cli import app
from runtime.errors import InputError
from runtime.testing import collect_rows

HERE = Path(__file__).resolve().parent.parent


def _rows(*names: str, size: int = 1, seed: int = 3) -> list[dict]:
    return list(generate.rows(generate.DatasetSpec(generators=list(names), size=size, seed=seed)))


def test_rows_are_nemo_gym_shaped_and_name_their_recipe() -> None:
    rows = _rows("leg_counting", "gcd", size=2)
    assert [r["generator"]["name"] for r in rows] == ["leg_counting"] * 2 + ["gcd"] * 2
    for r in rows:
        assert r["metadata"]["source_dataset"] == r["generator"]["name"]
        assert r["responses_create_params"]["input"][-1] == {"role": "user", "content": r["question"]}
        assert r["env"] == "reasoning_gym"
    assert rows[0]["question"] != rows[1]["question"]
    assert _rows("leg_counting", size=2) == rows[:2]  # the same spec writes the same rows


def test_difficulty_by_config_and_by_curriculum_level() -> None:
    def difficulty(g: generate.GeneratorSpec) -> dict:
        spec = generate.DatasetSpec(generators={"chain_sum": g}, size=2, seed=1)
        return next(generate.rows(spec))["metadata"]["difficulty"]

    assert difficulty(generate.GeneratorSpec(level=0)) == {"num_terms": [2, 2], "num_digits": [1, 1]}
    assert difficulty(generate.GeneratorSpec(level=3))["num_digits"] == [1, 4]
    assert difficulty(generate.GeneratorSpec(config={"min_terms": 4, "max_terms": 4}))["num_terms"] == [4, 4]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (generate.DatasetSpec(generators=["nosuch"]), "generator 'nosuch' is not a reasoning-gym generator"),
        (generate.DatasetSpec(generators=["gcd"], prompt="loud"), "prompt 'loud' is not one of"),
        (
            generate.DatasetSpec(generators={"gcd": generate.GeneratorSpec(config={"bogus": 1})}),
            "generator 'gcd': TypeError",
        ),
        (generate.DatasetSpec(generators={"acre": generate.GeneratorSpec(level=1)}), "has no curriculum"),
    ],
)
def test_a_wrong_spec_names_what_is_wrong(spec: generate.DatasetSpec, message: str) -> None:
    with pytest.raises(InputError, match=message):
        list(generate.rows(spec))


def test_answers_are_read_as_nemo_gym_reads_them() -> None:
    assert scoring.extract("think... <answer>1</answer> then <answer> 42 </answer>") == "42"
    assert scoring.extract("so \\boxed{7} it is") == "7"
    assert scoring.extract("  plain  ") == "plain"
    assert scoring.extract("") is None


def test_scores_come_from_the_generators_scorer() -> None:
    row = _rows("prime_factorization")[0]
    entry = {k: row[k] for k in ("question", "answer", "metadata")}
    assert scoring.score(f"<answer>{row['answer']}</answer>", entry, row["generator"])["score"] == 1.0
    unreadable = scoring.score("<answer>many</answer>", entry, row["generator"])  # its scorer raises on this
    assert unreadable["score"] == 0.0 and "could not read" in unreadable["reason"]


def test_an_entry_json_cannot_carry_is_regenerated_from_its_recipe() -> None:
    row = _rows("rearc")[0]
    assert row["generator"]["rebuild"]
    entry = {k: row[k] for k in ("question", "answer", "metadata")}
    assert scoring.score(f"<answer>{row['answer']}</answer>", entry, row["generator"])["score"] == 1.0
    assert scoring.score(f"<answer>{row['answer']}</answer>", entry, None)["score"] < 1.0  # read as JSON only


def test_the_command_writes_the_rows(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    out = tmp_path / "rows.jsonl"
    result = CliRunner().invoke(app, ["tasks", "reasoning-gym", str(HERE / "data" / "example.yaml"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_text() == (HERE / "data" / "example.jsonl").read_text()  # the shipped examples are its output
    bad = CliRunner().invoke(app, ["tasks", "reasoning-gym", "-g", "nosuch", "-o", str(out)])
    assert bad.exit_code == 2 and "not a reasoning-gym generator" in bad.output


async def test_check_passes_both_ways() -> None:
    report = await check("reasoning_gym")
    assert report.ok, [t.problems for t in report.tasks]
    assert {report.right(i).verifier["group"] for i in range(len(report.tasks))} == {
        json.loads(line)["metadata"]["source_dataset"] for line in (HERE / "data" / "example.jsonl").open()
    }


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged_with_a_profile_per_generator(tmp_path: Path) -> None:
    rows = [
        {k: r[k] for k in ("responses_create_params", "question", "answer", "metadata")} for r in _rows("gcd", "lcm")
    ]
    rows += [{"responses_create_params": {"input": "what?"}, "question": "what?", "answer": "1", "metadata": {}}]
    summary, out = await collect_rows(tmp_path, rows, env="reasoning_gym", repeats=2)
    assert [r["reward"] for r in out[:4]] == [1.0] * 4
    assert out[4]["failure_kind"] == "invalid_input" and "metadata.source_dataset" in out[4]["failure_reason"]
    profile = json.loads((summary.run_dir / "profile.json").read_text())
    assert sorted(profile["by_group"]) == ["-", "gcd", "lcm"]  # "-": the row no verifier could group
    assert profile["by_group"]["gcd"]["present"] == 2
