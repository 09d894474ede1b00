"""How the simulated policy plays the NeMo Gym servers the bridge is tested with, right and wrong.

A bridged server's verifier is its own; what a perfect answer looks like is not, so each server the
bridge knows gets a reference here, by resources server name. A server with none is played from the
answer key (its rows' ``expected_answer``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from functions.nemo_gym_bridge import servers
from runtime.sdk import Reference, Task, call


def _mcqa(meta: dict[str, Any]) -> Reference:
    letters = [next(iter(o)) for o in meta.get("options", []) if isinstance(o, dict) and o]
    right = str(meta["expected_answer"])
    wrong = next((x for x in letters if x != right), "Z" if right != "Z" else "Y")
    return Reference(right=f"The answer is \\boxed{{{right}}}", wrong=f"The answer is \\boxed{{{wrong}}}")


def _counter(meta: dict[str, Any]) -> Reference:
    delta = int(meta["expected_count"]) - int(meta.get("initial_count", 0))
    done = f"The counter is at {meta['expected_count']}."
    return Reference(
        right=[call("increment_counter", count=delta), call("get_counter_value"), done],
        wrong=[call("increment_counter", count=delta + 1), call("get_counter_value"), done],
    )


def _reasoning_gym(meta: dict[str, Any]) -> Reference:
    return Reference(right=f"<answer>{meta['answer']}</answer>", wrong="I cannot tell.")


REFERENCES: dict[str, Callable[[dict[str, Any]], Reference]] = {
    "mcqa": _mcqa,
    "example_session_state_mgmt": _counter,
    "reasoning_gym": _reasoning_gym,
}


def reference(task: Task[Any]) -> Reference:
    server = servers.server_name(servers.key_of(task.meta))
    play = REFERENCES.get(server)
    if play is None:
        raise LookupError(f"the bridge has no reference for NeMo Gym server {server!r}")
    return play(dict(task.meta))
