"""genrm_compare: custom roles, the swap check cancelling position bias, unparseable GenRM replies, NeMo Gym rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.schemas import Session, Usage
from functions.genrm_compare.env import ENVIRONMENT, parse, verify
from runtime import judges
from runtime.checking import check
from runtime.errors import JudgeError
from runtime.model.client import ModelOutput
from runtime.sdk import Rollout, Task
from runtime.testing import Harness, collect_rows


def test_parse() -> None:
    assert parse('Thinking... {"score_1": 4, "score_2": 3, "ranking": 2}')["ranking"] == 2.0
    with pytest.raises(JudgeError, match="no JSON with a ranking"):
        parse('{"score_1": 4, "ranking": 9}')
    with pytest.raises(JudgeError):
        parse("Response 1 is better.")


async def test_the_swap_check_cancels_position_bias(harness: Harness) -> None:
    seen: list[list[str]] = []

    async def biased(items: list, params: dict, session: Session) -> ModelOutput:  # always prefers response 1
        seen.append([i["role"] for i in items])
        text = json.dumps({"score_1": 4, "score_2": 3, "ranking": 2})
        return ModelOutput(
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}], Usage(), {}
        )

    meta = ENVIRONMENT.check_meta({"reference_response": "ref", "principle": "Be brief."})
    task = Task(0, 0, meta, {}, [{"role": "user", "content": "hi"}])
    reply = Rollout(
        output=[{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "mine"}]}],
        state={},
    )
    session = Session(
        session_id="r.0.0",
        run_id="r",
        task_index=0,
        agent="a",
        env="genrm_compare",
        model="policy",
        step=1,
        phase="verify",
        params={},
    )
    with judges.bound(harness.js, session) as binding:
        binding.respond = biased
        got = await verify(task, reply)
    assert got.reward == pytest.approx(0.5) and got.info["position_bias"] == pytest.approx(0.6)
    assert seen[0] == ["user", "response_1", "response_2", "principle"]


async def test_check_passes_both_ways() -> None:
    report = await check("genrm_compare")
    assert report.ok, [t.problems for t in report.tasks]
    assert report.right(0).verifier["models"]["genrm"]["calls"] == 2


CONVERSATION = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue?"},
    {"role": "user", "content": "Another."},
]
NEMO_ROWS = [  # NeMo Gym genrm_compare rows' shape: a conversation ending in a user turn, agent_ref, dataset
    {
        "responses_create_params": {"input": CONVERSATION, "tools": [], "parallel_tool_calls": False},
        "agent_ref": {"type": "responses_api_agents", "name": "genrm_simple_agent"},
        "dataset": "hs3",
        "reference_response": "Green.",
    },
    {
        "responses_create_params": {"input": CONVERSATION, "tools": [], "parallel_tool_calls": False},
        "agent_ref": {"type": "responses_api_agents", "name": "genrm_simple_agent"},
        "dataset": "hs3",
    },
]


@pytest.mark.nemo_rows
async def test_nemo_gym_rows(tmp_path: Path) -> None:
    _, rows = await collect_rows(tmp_path, NEMO_ROWS, env="genrm_compare")
    assert rows[0]["reward"] == 1.0 and rows[0]["dataset"] == "hs3", rows[0].get("failure_reason")
    assert rows[1]["failure_kind"] == "invalid_input"
    assert "environment 'genrm_compare': the task row has no field `reference_response`" in rows[1]["failure_reason"]
