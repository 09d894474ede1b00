"""Running SQL for the verifier, in the off-loop process: a fresh in-memory SQLite database per call.

The row's context (CREATE TABLE + INSERT, in its dialect) is transpiled to SQLite by sqlglot; the
gold and the candidate queries likewise. The candidate must be one read-only query: anything else
(writes, schema changes, ATTACH, PRAGMA, several statements) is refused before it runs, SQLite's
authorizer denies every action but reading, and a query past the time bound is interrupted.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections import Counter
from typing import Any

import sqlglot
from sqlglot import exp

logging.getLogger("sqlglot").setLevel(logging.ERROR)

DIALECTS = {"postgresql": "postgres", "postgres": "postgres", "mysql": "mysql", "sqlite": "sqlite"}
_FENCE = re.compile(r"```(?:sql|SQL)?\s*\n?(.*?)```", re.S)
_READ_ONLY = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


def extract_sql(text: str) -> str | None:
    """The last fenced SQL block of a reply, else the reply if it reads as a query."""
    blocks = [b.strip() for b in _FENCE.findall(text) if b.strip()]
    if blocks:
        return blocks[-1]
    stripped = text.strip()
    return stripped if re.match(r"(?is)^\s*(select|with)\b", stripped) else None


def to_sqlite(sql: str, dialect: str) -> list[str]:
    """Statements of ``sql`` as SQLite (MySQL's AUTO_INCREMENT and unsigned integer types mapped)."""
    out = []
    for tree in sqlglot.parse(sql, read=DIALECTS.get(dialect, dialect)):
        if tree is None:
            continue
        for node in list(tree.find_all(exp.AutoIncrementColumnConstraint)):
            (node.parent if isinstance(node.parent, exp.ColumnConstraint) else node).pop()
        for dt in list(tree.find_all(exp.DataType)):
            if dt.is_type(*exp.DataType.INTEGER_TYPES):
                dt.replace(exp.DataType.build("INTEGER"))
        out.append(tree.sql(dialect="sqlite"))
    return out


def refused(candidate: str, dialect: str) -> str | None:
    """Why the candidate may not run (not one read-only query), or None."""
    if re.search(r"(?i)\b(attach|detach|pragma|vacuum|load_extension)\b", candidate):
        return "it reaches outside the database (ATTACH, DETACH, PRAGMA, VACUUM or load_extension)"
    try:
        trees = [t for t in sqlglot.parse(candidate, read=DIALECTS.get(dialect, dialect)) if t is not None]
    except sqlglot.errors.ParseError as exc:
        return f"it does not parse: {str(exc).splitlines()[0][:200]}"
    if len(trees) != 1:
        return f"it is {len(trees)} statements, not one query"
    if not isinstance(trees[0], exp.Query):
        return f"it is a {type(trees[0]).__name__.upper()} statement, not a read-only query"
    if any(True for _ in trees[0].find_all(exp.Insert, exp.Update, exp.Delete, exp.Create, exp.Drop)):
        return "it modifies the database"
    return None


def _database(context: list[str]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.create_function("SUBSTRING_INDEX", 3, _substring_index, deterministic=True)
    for statement in context:
        db.execute(statement)
    return db


def _substring_index(text: Any, sep: Any, count: Any) -> Any:
    if text is None or sep is None or count is None:
        return None
    parts = str(text).split(str(sep))
    n = int(count)
    return str(sep).join(parts[:n] if n >= 0 else parts[n:])


def _query(db: sqlite3.Connection, sql: str, limit_s: float, guarded: bool) -> list[tuple[Any, ...]]:
    deadline = time.monotonic() + limit_s
    db.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    if guarded:
        db.set_authorizer(lambda action, *_: sqlite3.SQLITE_OK if action in _READ_ONLY else sqlite3.SQLITE_DENY)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.set_authorizer(None)
        db.set_progress_handler(None, 0)


def _norm(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def run(gold: str, candidate: str, context: str, dialect: str, ordered: bool | None, limit_s: float) -> dict[str, Any]:
    """{"reward", "info"} for the candidate against the gold, or {"invalid": reason} for a row that cannot run."""
    try:
        statements = to_sqlite(context, dialect)
        db = _database(statements)
    except (sqlglot.errors.SqlglotError, sqlite3.Error) as exc:
        return {"invalid": f"task field `sql_context` does not build on SQLite: {exc}"}
    try:
        gold_sql = to_sqlite(gold, dialect)[-1]
        want = _norm(_query(db, gold_sql, limit_s, guarded=False))
    except (sqlglot.errors.SqlglotError, sqlite3.Error, IndexError) as exc:
        return {"invalid": f"the gold query (`sql`) does not run on SQLite: {exc}"}
    why = refused(candidate, dialect)
    if why is not None:
        return {"reward": 0.0, "info": {"reason": f"candidate SQL refused: {why}"}}
    try:
        got = _norm(_query(db, to_sqlite(candidate, dialect)[-1], limit_s, guarded=True))
    except sqlite3.DatabaseError as exc:
        late = "interrupted" in str(exc)
        reason = f"candidate SQL ran past {limit_s:g} s" if late else f"candidate SQL failed: {exc}"
        return {"reward": 0.0, "info": {"reason": reason}}
    except sqlglot.errors.SqlglotError as exc:
        return {"reward": 0.0, "info": {"reason": f"candidate SQL does not transpile: {exc}"}}
    finally:
        db.close()
    in_order = ordered if ordered is not None else bool(sqlglot.parse_one(gold_sql, read="sqlite").args.get("order"))
    same = got == want if in_order else Counter(got) == Counter(want)
    info: dict[str, Any] = {"rows": len(got), "expected_rows": len(want), "order_aware": in_order}
    if not same:
        info["reason"] = "result sets differ" + (" (or their order)" if in_order else "")
    return {"reward": float(same), "info": info}
