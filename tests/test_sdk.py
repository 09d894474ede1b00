"""The function SDK's public surface, declared once and pinned; and what it promises authors."""

from __future__ import annotations

import dataclasses

import pytest

import runtime.sdk as sdk
from broker.schemas import Options, Session
from runtime.engine.environments import _reward
from runtime.errors import VerifierError


def test_the_public_surface_is_declared_once_and_sorted() -> None:
    assert sdk.__all__ == sorted(sdk.__all__)
    assert sdk.__all__ == [
        "Action",
        "Agent",
        "AgentContext",
        "Call",
        "CallTools",
        "Check",
        "Context",
        "Continue",
        "EnvLost",
        "Environment",
        "Finish",
        "Fit",
        "InvalidInput",
        "Model",
        "Reference",
        "Respond",
        "Retry",
        "Rollout",
        "SessionView",
        "StepFn",
        "Task",
        "Tool",
        "ToolError",
        "Unfit",
        "Verdict",
        "VerifierError",
        "call",
        "function_calls",
        "load",
        "mark",
        "offload",
        "tool",
    ]
    assert all(hasattr(sdk, name) for name in sdk.__all__)


def test_context_injection_is_explicit() -> None:
    async def counter(ctx: sdk.Context, step: int) -> str:
        """Count."""
        return str(step)

    with pytest.raises(TypeError, match=r"takes a Context first: declare it with @tool\(context=True\)"):
        sdk.Tool(counter)
    declared = sdk.tool(context=True)(counter)
    assert isinstance(declared, sdk.Tool) and declared.wants_context
    assert list(declared.parameters["properties"]) == ["step"]  # the context is not a model argument

    async def plain(x: int) -> str:
        """Echo."""
        return str(x)

    assert not sdk.Tool(plain).wants_context


def session() -> Session:
    return Session(
        session_id="r.0.0",
        run_id="r",
        task_index=0,
        agent="a",
        env="e",
        model="policy",
        step=1,
        phase="model",
        params={"tools": []},
        meta={"expected_answer": "42"},
        options=Options(),
    )


def test_an_agent_sees_a_read_only_view_of_its_session() -> None:
    async def respond(items: list, params: dict, s: Session) -> object:  # type: ignore[type-arg]
        raise AssertionError("not called")

    ctx = sdk.AgentContext(session(), respond)  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.session.run_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.session.meta["expected_answer"] = "7"  # type: ignore[index]
    with pytest.raises(TypeError):
        ctx.params["tools"] = ["x"]  # type: ignore[index]
    ctx.state["turn"] = 1  # its own state and the conversation are its to change
    ctx.items.append({"type": "message", "role": "user", "content": "go on"})
    assert ctx.state == {"turn": 1} and len(ctx.items) == 1


@pytest.mark.parametrize(
    ("verdict", "reward"),
    [(True, 1.0), (False, 0.0), (0.25, 0.25), (1, 1.0), (sdk.Verdict(True, {"why": "x"}), 1.0)],
)
def test_a_verifier_may_return_a_bool_a_number_or_a_verdict(verdict: object, reward: float) -> None:
    env = sdk.Environment(name="e", verify=None)  # type: ignore[arg-type]
    assert _reward(env, verdict)[0] == reward


@pytest.mark.parametrize("verdict", [None, "1.0", float("nan"), float("inf")])
def test_a_verifier_answer_that_is_not_a_finite_number_is_a_verifier_error(verdict: object) -> None:
    env = sdk.Environment(name="e", verify=None)  # type: ignore[arg-type]
    with pytest.raises(VerifierError, match="not a finite number"):
        _reward(env, verdict)
