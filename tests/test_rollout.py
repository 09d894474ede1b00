"""End-to-end rollouts through a real nats-server, real workers and the simulated policy over HTTP."""

from __future__ import annotations

import msgspec

from broker import topology
from broker.schemas import Tools, encoder, tool_decoder
from conftest import MATH_TASKS
from runtime.engine.registry import register
from runtime.model.sampling import NEUTRAL
from runtime.sdk import load
from runtime.testing import Harness, wait_until


async def test_full_rollout_with_tool_call(harness: Harness, math_rows: list[dict]) -> None:
    """A task whose model calls the calculator first ends as one Result with the tool round trip in it."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    row = math_rows[0]
    tools = [
        {
            "type": "function",
            "name": "calculator",
            "description": "calc",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        }
    ]
    await harness.submit(
        harness.start(
            {**row, "responses_create_params": {**row["responses_create_params"], "tools": tools}}, run_id="r1"
        )
    )
    [result] = await harness.results("r1", 1)

    assert result.reward == 1.0 and result.failure_kind is None
    assert [i["type"] for i in result.output] == ["function_call", "function_call_output", "message"]
    call, out = result.output[0], result.output[1]
    assert call["name"] == "calculator" and out["call_id"] == call["call_id"]
    assert out["output"] == row["expected_answer"]  # the calculator really ran on the model's arguments
    assert result.verifier["extracted_answer"] == row["expected_answer"]
    t = result.timings
    # math's verifier runs in the agent's last turn (verify_inline): Start, Tools, Resume; no Verify hop
    assert t.model_calls == 2 and t.tool_calls == 1 and t.hops == 3
    assert t.total_s > 0 and t.model_s > 0 and t.verify_s > 0
    assert result.sampling == NEUTRAL  # every parameter that decides the distribution, sent and recorded
    session = await harness.session(result.session_id)
    assert session is not None and session.phase == "done" and session.result == result


async def test_rollout_without_tools_goes_straight_to_verify(harness: Harness, math_rows: list[dict]) -> None:
    await harness.simulate(MATH_TASKS, accuracy=0.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    row = {**math_rows[1], "responses_create_params": {**math_rows[1]["responses_create_params"], "tools": []}}
    await harness.submit(harness.start(row, run_id="r2"))  # tools: [] offers none (left out: the environment's)
    [result] = await harness.results("r2", 1)
    assert result.reward == 0.0  # accuracy 0: always wrong, and a wrong answer is a reward, not a failure
    assert result.failure_kind is None
    assert [i["type"] for i in result.output] == ["message"]


async def test_chat_completions_only_endpoint(harness: Harness, math_rows: list[dict]) -> None:
    """An endpoint without /v1/responses is probed once and spoken to in Chat Completions."""
    from starlette.routing import Route

    url = await harness.simulate(MATH_TASKS, accuracy=1.0)
    app = harness._sim_server.server.config.app  # type: ignore[union-attr]
    app.router.routes = [r for r in app.router.routes if not (isinstance(r, Route) and r.path == "/v1/responses")]
    await harness.worker("simple_agent")
    await harness.worker("math")
    row = math_rows[2]
    row = {**row, "responses_create_params": {**row["responses_create_params"], "tools": [harness_tool_spec()]}}
    await harness.submit(harness.start(row, run_id="r3"))
    [result] = await harness.results("r3", 1)
    assert result.reward == 1.0, result
    assert [i["type"] for i in result.output] == ["function_call", "function_call_output", "message"]
    assert url.endswith("/v1")


def harness_tool_spec() -> dict:
    from functions.math.env import ENVIRONMENT

    return ENVIRONMENT.tool_specs()[0]


async def test_redelivered_tools_message_commits_one_step(harness: Harness, math_rows: list[dict]) -> None:
    """A Tools message delivered twice commits one step and emits one Resume (DESIGN invariant 2)."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    row = {
        **math_rows[0],
        "responses_create_params": {**math_rows[0]["responses_create_params"], "tools": [harness_tool_spec()]},
    }
    await register(harness.js, load("math"))  # math is known, but none of its workers runs yet
    agent = await harness.worker("simple_agent")
    await harness.submit(harness.start(row, env="math", run_id="r4"))  # no environment worker yet
    tool_subject = topology.tool_subject("math")
    await wait_until(lambda: harness.pending(tool_subject), f"the agent's Tools message on {tool_subject}")
    await harness.stop_workers()
    del agent
    [raw] = await harness.read(tool_subject, stream=topology.WORK_STREAM)
    tools = tool_decoder.decode(raw.data)
    assert isinstance(tools, Tools) and tools.step == 1
    # the same message again, under another message id, as a redelivery after a crash would be
    await harness.send(tool_subject, tools, "redelivered-copy")
    assert await harness.pending(tool_subject) == 2

    await harness.worker("math")
    resume_subject = topology.resume_subject("simple_agent")

    async def both_acked() -> bool:  # work-queue retention: a message leaves the stream when acked
        return await harness.pending(tool_subject) == 0

    await wait_until(both_acked, f"both copies on {tool_subject} to be handled and acknowledged")
    await harness.stop_workers()
    resumes = await harness.read(resume_subject, stream=topology.WORK_STREAM)
    assert len(resumes) == 1
    assert msgspec.json.decode(resumes[0].data)["step"] == 2
    session = await harness.session(tools.session_id)
    assert session is not None and session.step == 2 and session.phase == "model"
    assert [i["type"] for i in session.items[session.n_input :]] == ["function_call", "function_call_output"]


async def test_duplicate_starts_yield_one_result(harness: Harness, math_rows: list[dict]) -> None:
    """The same Start published twice (even under different ids) produces one Result."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    start = harness.start(math_rows[3], run_id="r5")
    await harness.submit(start)
    await harness.submit(start)  # same Nats-Msg-Id: dropped by the stream
    await harness.submit(start, msg_id="another-id")  # a different id: stale when it arrives
    await harness.results("r5", 1)
    results = await harness.final_results("r5")  # all three Starts handled and acknowledged
    assert len(results) == 1
    assert results[0].reward == 1.0


async def test_malformed_task_fails_with_its_field(harness: Harness, math_rows: list[dict]) -> None:
    """A malformed task ends as a failed Result naming the bad field; the other rollouts still finish."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    good = harness.start(math_rows[0], run_id="r6", task_index=0)
    bad_input = msgspec.structs.replace(good, task_index=1, responses_create_params={"input": 5})
    bad_options = encoder.encode(msgspec.structs.replace(good, task_index=2)).replace(
        b'"kind":"start"', b'"kind":"start","options":{"max_steps":"many"}', 1
    )
    bad_meta = msgspec.structs.replace(good, task_index=3, meta={"expected_answer": ["not", "a", "number"]})
    for msg in (good, bad_input, bad_options, bad_meta):
        await harness.submit(msg)
    results = {r.task_index: r for r in await harness.results("r6", 4)}
    assert sorted(results) == [0, 1, 2, 3]
    assert results[0].reward == 1.0
    for i, field in ((1, "$.responses_create_params.input"), (2, "$.options.max_steps"), (3, "$.meta.expected_answer")):
        r = results[i]
        assert r.reward is None and r.failure_kind == "invalid_input", r
        assert field in (r.failure_reason or ""), r.failure_reason
    dead = await harness.read("gym.dead.simple_agent", stream=topology.DEAD_STREAM)
    assert len(dead) == 1  # the message that could not even be decoded is kept with its error
    letter = msgspec.json.decode(dead[0].data)
    assert letter["failure_kind"] == "invalid_input" and "$.options.max_steps" in letter["error"]


async def test_max_steps_bounds_the_tool_loop(harness: Harness, math_rows: list[dict]) -> None:
    """With max_steps=1 the model's tool call is not run: the rollout goes to the verifier."""
    await harness.simulate(MATH_TASKS, accuracy=1.0)
    await harness.worker("simple_agent")
    await harness.worker("math")
    row = {
        **math_rows[0],
        "responses_create_params": {**math_rows[0]["responses_create_params"], "tools": [harness_tool_spec()]},
    }
    await harness.submit(harness.start(row, run_id="r7", max_steps=1))
    [result] = await harness.results("r7", 1)
    assert [i["type"] for i in result.output] == ["function_call"]
    assert result.reward == 0.0 and result.failure_kind is None


async def test_model_mistakes_in_tool_calls_go_back_to_the_model(harness: Harness) -> None:
    """Unknown tool, invalid JSON, schema violation: each becomes an error output, not a crash."""
    from broker.schemas import FunctionCall, Session
    from runtime.engine.environments import run_tools
    from runtime.sdk import load

    env = load("math")
    session = Session(
        session_id="x.0.0",
        run_id="x",
        task_index=0,
        agent="a",
        env="math",
        model="m",
        step=1,
        phase="tools",
        params={},
        meta={"expected_answer": "1"},
    )
    calls = [
        FunctionCall(call_id="1", name="search", arguments="{}"),
        FunctionCall(call_id="2", name="calculator", arguments="{not json"),
        FunctionCall(call_id="3", name="calculator", arguments='{"expression": 7}'),
        FunctionCall(call_id="4", name="calculator", arguments='{"expression": "6*7"}'),
    ]
    outputs = [o["output"] for o in await run_tools(env, session, calls)]  # type: ignore[arg-type]
    assert "unknown tool 'search'" in outputs[0]
    assert "not valid JSON" in outputs[1]
    assert "$.expression" in outputs[2] and "not of type 'string'" in outputs[2]
    assert outputs[3] == "42"
    assert session.timings.tool_calls == 4
