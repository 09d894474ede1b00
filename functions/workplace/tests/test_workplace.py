"""workplace: state compared by content, a row's own world, bad ground truth, NeMo Gym-shaped rows, the check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from functions.workplace import world as w
from functions.workplace.env import ENVIRONMENT as ENV
from runtime.checking import check
from runtime.errors import InvalidInput
from runtime.testing import collect_rows


def test_the_same_actions_in_another_order_end_equal() -> None:
    a, b = w.fresh(None), w.fresh(None)
    w.send_email(a, "tom@acme.test", "x", "1")
    w.send_email(a, "lena@acme.test", "y", "2")
    w.send_email(b, "lena@acme.test", "y", "2")
    w.send_email(b, "tom@acme.test", "x", "1")
    assert w.canonical(a) == w.canonical(b)
    w.delete_email(b, "e1")
    assert w.canonical(a) != w.canonical(b)


def test_a_ground_truth_that_does_not_replay_is_invalid_input() -> None:
    bad = [{"name": "email_delete_email", "arguments": json.dumps({"email_id": "nope"})}]
    with pytest.raises(InvalidInput, match=r"environment 'workplace'.*`ground_truth` does not replay.*'nope'"):
        ENV.check_meta({"ground_truth": bad})


async def test_check_passes_both_ways() -> None:
    report = await check("workplace")
    assert report.ok, [t.problems for t in report.tasks]
    assert "differs" in report.wrong(0).verifier  # what was expected and not done


WORLD = {
    "contacts": [{"name": "Ann Lee", "email": "ann@co.test"}],
    "emails": [
        {"email_id": "00000057", "sender": "ann@co.test", "recipient": "me@co.test", "subject": "Task", "body": "?"}
    ],
    "events": [],
}
NEMO_ROWS = [  # NeMo Gym workplace_assistant rows' shape: ground_truth calls with JSON-string arguments
    {
        "id": 0,
        "responses_create_params": {
            "input": [{"role": "user", "content": "Reply to Ann's last email with 'On it.'"}],
            "parallel_tool_calls": False,
            "temperature": 1,
        },
        "ground_truth": [{"name": "email_reply_email", "arguments": '{"email_id": "00000057", "body": "On it."}'}],
        "category": "workplace_assistant_email",
        "environment_name": "workplace_assistant",
        "world": WORLD,
    }
]


@pytest.mark.nemo_rows
async def test_nemo_gym_shaped_rows_run(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="workplace")
    assert [r["reward"] for r in rows] == [1.0], [r.get("failure_reason") for r in rows]
    assert rows[0]["category"] == "workplace_assistant_email"
