"""counter: tools that change a per-rollout counter; the reward is 1.0 iff it ends at ``expected_count``.

The counter starts at the row's ``initial_count`` (0 if absent) when the session is seeded, lives in
the session record (any replica takes any call), and changes only through ``increment_counter``.
Rows of NeMo Gym's ``example_session_state_mgmt`` resources server run unchanged (same tool names,
arguments and fields).
"""

from __future__ import annotations

import msgspec

from runtime.sdk import Context, Environment, Reference, Rollout, Task, Verdict, call, tool


class Meta(msgspec.Struct, frozen=True):
    expected_count: int
    initial_count: int = 0


async def seed(ctx: Context[Meta]) -> None:
    ctx.state["count"] = ctx.task.meta.initial_count


@tool(context=True)
async def increment_counter(ctx: Context[Meta], count: int) -> dict[str, int]:
    """Add count (which may be negative) to the counter and return its new value."""
    ctx.state["count"] = ctx.state.get("count", 0) + count
    return {"count": ctx.state["count"]}


@tool(context=True)
async def get_counter_value(ctx: Context[Meta]) -> dict[str, int]:
    """Return the counter's current value."""
    return {"count": ctx.state.get("count", 0)}


async def verify(task: Task[Meta], rollout: Rollout) -> Verdict:
    """1.0 iff the counter's final value is the expected count."""
    final = rollout.state.get("count", task.meta.initial_count)
    return Verdict(
        final == task.meta.expected_count, {"final_count": final, "expected_count": task.meta.expected_count}
    )


def reference(task: Task[Meta]) -> Reference:
    delta = task.meta.expected_count - task.meta.initial_count
    done = f"The counter is now at {task.meta.expected_count}."
    return Reference(
        right=[call("increment_counter", count=delta), call("get_counter_value"), done],
        wrong=[call("increment_counter", count=delta + 1), call("get_counter_value"), done],
    )


ENVIRONMENT = Environment(
    name="counter",
    meta=Meta,
    seed=seed,
    tools=[increment_counter, get_counter_value],
    verify=verify,
    reference=reference,
    accepts=["example_session_state_mgmt"],
)
