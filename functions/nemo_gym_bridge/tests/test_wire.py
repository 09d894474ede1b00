"""nemo_gym_bridge without NeMo Gym: routing a row to its server, NeMo Gym's shapes, telling instances apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from functions.nemo_gym_bridge import servers, wire
from runtime.errors import EnvLost, InvalidInput, VerifierError
from runtime.routing import route
from runtime.sdk import Task


@pytest.fixture
def two_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text("servers:\n  mcqa: {instances: 1}\n  example_session_state_mgmt: {urls: ['http://127.0.0.1:1']}\n")
    monkeypatch.setenv("GYMBUS_NEMO_GYM_SERVERS", str(path))
    return path


def test_a_row_goes_to_the_server_it_names(two_servers: Path) -> None:
    ref = {"type": "responses_api_agents", "name": "example_session_state_mgmt_simple_agent"}
    assert servers.key_of({"agent_ref": ref}) == "example_session_state_mgmt"
    assert servers.key_of({"agent_ref": {"name": "mcqa_simple_agent"}}) == "mcqa"
    assert servers.key_of({"resources_server": "mcqa", "agent_ref": ref}) == "mcqa"
    with pytest.raises(InvalidInput, match="names no configured NeMo Gym server"):
        servers.key_of({"agent_ref": {"name": "wordle_gymnasium_agent"}})
    with pytest.raises(InvalidInput, match="`resources_server` 'nope' is not a configured server"):
        servers.key_of({"resources_server": "nope"})


def test_the_run_keeps_its_rows_whatever_agent_ref_names(two_servers: Path) -> None:
    row = {"responses_create_params": {"input": "q"}, "agent_ref": {"name": "mcqa_simple_agent"}}
    assert route(row, "simple_agent", "nemo_gym_bridge").env == "nemo_gym_bridge"
    assert route(row, "simple_agent", "math").env == "mcqa"  # other runs route it to gymbus's own mcqa


def test_a_row_naming_no_server_is_invalid_before_any_model_call(two_servers: Path) -> None:
    from functions.nemo_gym_bridge import ENVIRONMENT

    with pytest.raises(InvalidInput, match="names no configured NeMo Gym server"):
        ENVIRONMENT.check_meta({"expected_answer": "B"})


def test_a_missing_servers_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from functions.nemo_gym_bridge import ENVIRONMENT

    monkeypatch.setenv("GYMBUS_NEMO_GYM_SERVERS", str(tmp_path / "absent.yaml"))
    with pytest.raises(InvalidInput, match=r"absent\.yaml' does not exist"):
        ENVIRONMENT.check_meta({})


def test_the_response_verify_reads_has_nemo_gym_shapes() -> None:
    task = Task(index=3, rollout_index=1, meta={"expected_answer": "B"}, params={"tools": []}, input=[])
    output: list[dict[str, Any]] = [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "prompt_token_ids": [1]},
        {"type": "function_call_output", "call_id": "c1", "output": "3"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{B}"}]},
    ]
    response = wire.response_of(task, output)
    assert [i["type"] for i in response["output"]] == ["reasoning", "function_call", "function_call_output", "message"]
    assert "prompt_token_ids" not in response["output"][1]
    assert response["output"][3]["content"] == [{"type": "output_text", "text": "\\boxed{B}", "annotations": []}]
    assert all(i.get("id") for i in response["output"] if i["type"] != "function_call_output")


def test_an_instance_answering_under_another_name_lost_the_state() -> None:
    pin = {"server": "counter", "url": "http://x", "name": "counter_1a2b3c4d", "cookies": {}}
    wire.keep_cookies(pin, {"StatefulCounterResourcesServer___counter_1a2b3c4d": "v1"})
    wire.keep_cookies(pin, {"StatefulCounterResourcesServer___counter_1a2b3c4d": "v2", "lb": "x"})
    assert pin["cookies"] == {"StatefulCounterResourcesServer___counter_1a2b3c4d": "v2", "lb": "x"}
    with pytest.raises(EnvLost, match="now answers as 'counter_9f9f9f9f'"):
        wire.keep_cookies(pin, {"StatefulCounterResourcesServer___counter_9f9f9f9f": "v3"})
    running: dict[str, Any] = {"server": "mcqa", "url": "http://y", "name": None, "cookies": {}}  # started elsewhere
    wire.keep_cookies(running, {"MCQAResourcesServer___mcqa": "a"})
    with pytest.raises(EnvLost, match="restarted"):
        wire.keep_cookies(running, {"MCQAResourcesServer___mcqa_2": "b"})


def test_a_masked_sample_is_a_failure_never_a_reward() -> None:
    ok = wire.verdict("mcqa", {"reward": 1.0, "expected_answer": "B", "extracted_answer": "B"}, {"expected_answer"})
    assert ok.reward == 1.0 and ok.info == {"extracted_answer": "B", "resources_server": "mcqa"}
    lost = {"reward": 0.0, "mask_sample": True, "failure_kind": "session_lost", "failure_reason": "gone"}
    with pytest.raises(EnvLost, match="session_lost: gone"):
        wire.verdict("counter", lost, set())
    with pytest.raises(VerifierError, match="judge_failed"):
        wire.verdict("judge", {**lost, "failure_kind": "judge_failed"}, set())
    with pytest.raises(VerifierError, match="answered no reward"):
        wire.verdict("mcqa", {"detail": "nope"}, set())
