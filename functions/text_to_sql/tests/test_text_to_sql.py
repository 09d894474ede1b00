"""text_to_sql: execution on a per-call SQLite database, dangerous SQL refused with its reason, order-awareness,
long queries interrupted, bad rows as invalid_input, NeMo Gym-shaped rows through collect, the check."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.text_to_sql import sql
from runtime.checking import check
from runtime.testing import collect_rows

CONTEXT = """CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, score INTEGER);
INSERT INTO t VALUES (1, 'a', 5), (2, 'b', 9), (3, 'c', 7);"""


def run(candidate: str, gold: str = "SELECT name FROM t WHERE score > 6", **kw: object) -> dict:
    return sql.run(gold, candidate, CONTEXT, str(kw.get("dialect", "sqlite")), kw.get("ordered"), 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "candidate,why",
    [
        ("DELETE FROM t", "not a read-only query"),
        ("UPDATE t SET score = 0", "not a read-only query"),
        ("DROP TABLE t", "not a read-only query"),
        ("ATTACH DATABASE '/tmp/x.db' AS x", "reaches outside the database"),
        ("PRAGMA table_info(t)", "reaches outside the database"),
        ("SELECT 1; DELETE FROM t", "2 statements"),
        ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", ""),
    ],
)
def test_dangerous_sql_scores_zero_with_its_reason(candidate: str, why: str) -> None:
    out = run(candidate)
    assert out["reward"] == 0.0
    assert "refused" in out["info"]["reason"] or "failed" in out["info"]["reason"]
    assert why in out["info"]["reason"]


def test_result_sets_compared_order_aware_only_when_the_gold_orders() -> None:
    assert run("SELECT name FROM t WHERE score >= 7 ORDER BY name DESC")["reward"] == 1.0  # gold unordered
    ordered = "SELECT name FROM t ORDER BY score DESC"
    assert run("SELECT name FROM t ORDER BY score DESC", gold=ordered)["reward"] == 1.0
    wrong_order = run("SELECT name FROM t ORDER BY score", gold=ordered)
    assert wrong_order["reward"] == 0.0 and wrong_order["info"]["order_aware"] is True


def test_a_query_past_its_time_is_interrupted() -> None:
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
    out = run(endless)
    assert out["reward"] == 0.0 and "ran past 1 s" in out["info"]["reason"]


def test_rows_that_cannot_run_are_invalid() -> None:
    assert "sql_context" in sql.run("SELECT 1", "SELECT 1", "CREATE TABL x", "sqlite", None, 1.0)["invalid"]
    assert "gold query" in sql.run("SELECT nope FROM t", "SELECT 1", CONTEXT, "sqlite", None, 1.0)["invalid"]


def test_extraction() -> None:
    assert sql.extract_sql("Here:\n```sql\nSELECT 1\n```\nthen\n```sql\nSELECT 2\n```") == "SELECT 2"
    assert sql.extract_sql("select name from t") == "select name from t"
    assert sql.extract_sql("I cannot answer that.") is None


async def test_check_passes_both_ways() -> None:
    report = await check("text_to_sql")
    assert report.ok, [t.problems for t in report.tasks]


NEMO_ROWS: list[dict] = [
    {  # text_to_sql's shape (MySQL dialect)
        "responses_create_params": {
            "input": [
                {"role": "system", "content": "Return SQL in a ```sql block."},
                {"role": "user", "content": "<DIALECT>mysql</DIALECT> How many pets are cats?"},
            ]
        },
        "sql": "SELECT COUNT(*) FROM pets WHERE kind = 'cat';",
        "sql_dialect": "mysql",
        "sql_context": "CREATE TABLE pets (id INT UNSIGNED AUTO_INCREMENT PRIMARY KEY, kind CHAR(9)) ENGINE=InnoDB;\n"
        "INSERT INTO pets (kind) VALUES ('cat'), ('dog'), ('cat');",
        "sql_prompt": "How many pets are cats?",
        "uuid": "pets-001",
    },
    {  # bird_sql's shape
        "responses_create_params": {"input": [{"role": "user", "content": "Highest score?"}]},
        "question": "Highest score?",
        "gt_sql": "SELECT MAX(score) FROM t",
        "sql_context": "BEGIN TRANSACTION;\n" + CONTEXT + "\nCOMMIT;",
        "difficulty": "simple",
        "db_id": "scores",
        "id": 0,
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows_run_unchanged(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="text_to_sql")
    assert [r["reward"] for r in rows] == [1.0, 1.0], [r.get("failure_reason") for r in rows]
    assert rows[0]["uuid"] == "pets-001" and rows[1]["db_id"] == "scores"
