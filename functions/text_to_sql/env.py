"""text_to_sql: the candidate SQL and the gold SQL executed on a SQLite database built from the row.

The candidate is the last ```sql block of the reply (else the reply, if it reads as a query). Both
queries run on a fresh in-memory database built from ``sql_context`` (transpiled from
``sql_dialect`` by sqlglot), never shared between rollouts, in the verifier's off-loop process. The
reward is 1.0 iff the result sets are equal: as lists when the gold query orders its result (or the
row says ``ordered: true``), else as multisets. Candidate SQL that writes, changes the schema,
reaches outside the database (ATTACH, PRAGMA, ...) or runs past ``time_limit_s`` scores 0 with its
reason. A row whose context or gold query does not run on SQLite fails as ``invalid_input``. Rows of
NeMo Gym's ``text_to_sql`` (``sql``) and ``bird_sql`` (``gt_sql``) resources servers run unchanged;
they are scored by execution here, not by an LLM judge.
"""

from __future__ import annotations

import msgspec

from functions.text_to_sql import sql
from runtime.errors import InvalidInput
from runtime.sdk import Environment, Reference, Rollout, Task, Verdict, offload


class Meta(msgspec.Struct, frozen=True):
    sql_context: str
    sql: str | None = None
    gt_sql: str | None = None
    sql_dialect: str = "sqlite"
    ordered: bool | None = None
    time_limit_s: float = 2.0

    def __post_init__(self) -> None:
        if self.gold is None:
            raise ValueError("the task row has no gold query: `sql` (or `gt_sql`)")
        if self.sql_dialect.lower() not in sql.DIALECTS:
            raise ValueError(f"`sql_dialect` {self.sql_dialect!r} is not one of {sorted(sql.DIALECTS)}")

    @property
    def gold(self) -> str | None:
        return self.sql if self.sql is not None else self.gt_sql


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the candidate's result set equals the gold's (order-aware when the gold orders)."""
    m = task.meta
    candidate = sql.extract_sql(rollout.text)
    if candidate is None:
        return Verdict(0.0, {"reason": "no SQL found in the reply (expected a ```sql block)"})
    out = await offload(
        sql.run, m.gold, candidate, m.sql_context, m.sql_dialect.lower(), m.ordered, m.time_limit_s, timeout_s=30.0
    )
    if "invalid" in out:
        raise InvalidInput(f"environment 'text_to_sql': {out['invalid']}")
    return Verdict(out["reward"], {"extracted_answer": candidate, **out["info"]})


def reference(task: Task[Meta]) -> Reference:
    gold = task.meta.gold or ""
    return Reference(right=f"```sql\n{gold}\n```", wrong="```sql\nSELECT 1 WHERE 0 = 1\n```")


ENVIRONMENT = Environment(
    name="text_to_sql", meta=Meta, verify=verify, reference=reference, accepts=["text_to_sql", "bird_sql"]
)
