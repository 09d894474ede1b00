"""Golden files for the Responses <-> Chat Completions translator, both directions.

Each tests/golden/translate/<case>.json holds a case's input and the translator's expected output;
the inputs are built in tests/golden/cases.py. GYMBUS_UPDATE_GOLDEN=1 rewrites the files (read the diff).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runtime.model import translate
from tests.golden.cases import ANSWERS, MULTI_TURN, REQUESTS, RESPONSES_ANSWERS, WITH_REASONING

GOLDEN = Path(__file__).parent / "golden" / "translate"


def check(name: str, given: Any, got: Any) -> None:
    path = GOLDEN / f"{name}.json"
    if os.environ.get("GYMBUS_UPDATE_GOLDEN"):
        path.write_text(json.dumps({"given": given, "expected": got}, indent=2, ensure_ascii=False) + "\n")
    golden = json.loads(path.read_text())
    assert golden["given"] == json.loads(json.dumps(given)), f"{path.name}: the case changed; regenerate"
    assert json.loads(json.dumps(got)) == golden["expected"]


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_request_responses_to_chat(name: str) -> None:
    mode, body = REQUESTS[name]
    check(name, {"reasoning_mode": mode, "body": body}, translate.request_to_chat(body, mode))


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_answer_chat_to_responses(name: str) -> None:
    mode, resp = ANSWERS[name]
    reply = translate.chat_to_output(resp, mode)
    check(name, {"reasoning_mode": mode, "answer": resp}, vars(reply))


@pytest.mark.parametrize("name", sorted(RESPONSES_ANSWERS))
def test_answer_responses(name: str) -> None:
    mode, resp = RESPONSES_ANSWERS[name]
    check(name, {"reasoning_mode": mode, "answer": resp}, vars(translate.responses_output(resp, mode)))


def test_chat_messages_back_to_items() -> None:
    """The other request direction: Chat messages -> Responses items (golden, and a round trip)."""
    messages = translate.request_to_chat({"input": MULTI_TURN + WITH_REASONING})["messages"]
    items = translate.messages_to_items(messages)
    check("messages_to_items", {"messages": messages}, items)
    assert translate.items_to_messages(items) == messages


@pytest.mark.parametrize("mode", ["server", "think_tags"])
def test_parsed_reasoning_from_the_other_layer_is_an_error(mode: str) -> None:
    """One layer only: think_tags mode refuses a server-parsed field; server mode never parses text."""
    both = {"choices": [{"message": {"role": "assistant", "content": "<think>a</think>b", "reasoning": "a"}}]}
    if mode == "think_tags":
        with pytest.raises(translate.ReasoningConflict, match="--reasoning-parser"):
            translate.chat_to_output(both, mode)
    else:
        items = translate.chat_to_output(both, mode).items
        assert [i["type"] for i in items] == ["reasoning", "message"]
        assert items[1]["content"][0]["text"] == "<think>a</think>b"  # not parsed a second time


def test_usage_both_ways() -> None:
    chat = ANSWERS["answer_tool_calls"][1]["usage"]
    assert translate.usage_to_chat(translate.usage_from_chat(chat)) == chat


def test_training_keys_never_reach_the_server() -> None:
    body = translate.request_to_chat({"input": MULTI_TURN})
    assert not any(k in json.dumps(body) for k in translate.TRAINING_KEYS)
    stripped = translate.strip_training(MULTI_TURN)
    assert not any(k in json.dumps(stripped) for k in translate.TRAINING_KEYS)
    assert "prompt_token_ids" in MULTI_TURN[3]  # the session's items are left as they were
