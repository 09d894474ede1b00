"""simple_agent's step, against a scripted model (pure logic; the end-to-end path is in tests/)."""

from __future__ import annotations

from typing import Any

from broker.schemas import Options, Session, Usage
from functions.simple_agent.agent import step
from runtime.model.client import ModelOutput
from runtime.sdk import AgentContext, CallTools, Finish

CALL = {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": '{"expression": "1+1"}'}
ANSWER = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "\\boxed{2}"}]}


def session(max_steps: int = 4) -> Session:
    return Session(
        session_id="r.0.0",
        run_id="r",
        task_index=0,
        agent="simple_agent",
        env="math",
        model="m",
        step=1,
        phase="model",
        params={"tools": []},
        options=Options(max_steps=max_steps),
        items=[{"type": "message", "role": "user", "content": "1+1?"}],
        n_input=1,
    )


def scripted(*outputs: dict[str, Any]) -> Any:
    queue = list(outputs)

    async def respond(items: list[dict[str, Any]], params: dict[str, Any], s: Session) -> ModelOutput:
        return ModelOutput([queue.pop(0)], Usage(input_tokens=10, output_tokens=3), {"temperature": 1.0})

    return respond


async def test_tool_call_goes_to_the_environment() -> None:
    s = session()
    action = await step(AgentContext(s, scripted(CALL)))
    assert isinstance(action, CallTools) and action.calls[0].name == "calculator"
    assert s.items[-1] == CALL and s.turns_taken == 1 and s.usage.input_tokens == 10


async def test_text_answer_finishes() -> None:
    s = session()
    assert isinstance(await step(AgentContext(s, scripted(ANSWER))), Finish)


async def test_max_steps_reached_finishes_even_with_a_call() -> None:
    s = session(max_steps=1)
    assert isinstance(await step(AgentContext(s, scripted(CALL))), Finish)
